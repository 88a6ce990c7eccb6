// Package storecodec encodes the domain packages' stored values in the
// protobuf wire format, from struct tags, so that a domain type can keep the
// stored bytes of a protobuf message without importing the generated type.
//
// A field takes part when it carries a tag `pb:"N"`, N being its field
// number; untagged fields are not stored. Supported Go types, and how they
// are written:
//
//	string, []byte                    length-delimited
//	bool, int*, uint*, named integers varint (an enum or an int32 is written
//	                                  sign-extended, as protobuf does)
//	float64, float32                  double (fixed64), float (fixed32)
//	time.Time                         a google.protobuf.Timestamp message
//	time.Duration                     a google.protobuf.Duration message
//	struct, *struct                   a nested message
//	[]T of the above                  repeated (numbers packed; both forms read)
//	map[K]V, K string/integer/bool    map entries (key 1, value 2), in key order
//
// As in proto3, a zero scalar, a zero time or duration, an empty slice or
// map and a nil pointer are not written, and a nested struct value is written
// unless it is entirely zero. Unmarshal resets the value first, skips fields
// it does not know (a newer writer's) and fails on a field whose wire type
// does not match its Go type; it never panics on malformed input.
//
// The compatibility tests hold the codec to the protobuf runtime: a value it
// writes decodes with proto.Unmarshal into the message with the same field
// numbers, and a message proto.Marshal writes decodes into the same value.
package storecodec

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// ErrMalformed is the error Unmarshal wraps when the bytes are not a valid
// encoding of the value's type.
var ErrMalformed = errors.New("storecodec: malformed value")

// Marshal returns the protobuf wire encoding of v, a struct or a pointer to
// one.
func Marshal(v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil, errors.New("storecodec: Marshal of a nil pointer")
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return nil, fmt.Errorf("storecodec: Marshal of %s, want a struct", rv.Type())
	}
	if !rv.CanAddr() { // a struct passed by value: addressable fields read without copies
		c := reflect.New(rv.Type()).Elem()
		c.Set(rv)
		rv = c
	}
	p, err := planOf(rv.Type())
	if err != nil {
		return nil, err
	}
	return p.encode(nil, rv), nil
}

// Unmarshal decodes b into v, a non-nil pointer to a struct, after setting
// *v to its zero value.
func Unmarshal(b []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("storecodec: Unmarshal into %T, want a non-nil pointer to a struct", v)
	}
	rv = rv.Elem()
	p, err := planOf(rv.Type())
	if err != nil {
		return err
	}
	rv.SetZero()
	return p.decode(b, rv)
}

type kind uint8

const (
	kString kind = iota + 1
	kBytes
	kBool
	kInt
	kUint
	kDouble
	kFloat
	kTime
	kDuration
	kMessage
)

// elem is how one value (a field, a slice element, a map key or value) is
// written.
type elem struct {
	kind kind
	typ  reflect.Type // the Go type of the value
	ptr  bool         // kMessage: the value is a pointer to the struct
}

type cardinality uint8

const (
	single cardinality = iota
	repeated
	mapped
)

type field struct {
	num   protowire.Number
	index int
	name  string
	card  cardinality
	val   elem
	key   elem // mapped only
}

type plan struct {
	fields []field
	byNum  map[protowire.Number]int
	dense  []int16 // byNum for numbers below len(dense); -1 = not a field
}

// field returns the index in p.fields of field number num, or -1.
func (p *plan) field(num protowire.Number) int {
	if int(num) < len(p.dense) {
		return int(p.dense[num])
	}
	if i, ok := p.byNum[num]; ok {
		return i
	}
	return -1
}

var (
	plans        sync.Map // reflect.Type -> *plan
	timeType     = reflect.TypeOf(time.Time{})
	durationType = reflect.TypeOf(time.Duration(0))
)

func planOf(t reflect.Type) (*plan, error) {
	if p, ok := plans.Load(t); ok {
		return p.(*plan), nil
	}
	p := &plan{byNum: map[protowire.Number]int{}}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag, ok := sf.Tag.Lookup("pb")
		if !ok || tag == "-" {
			continue
		}
		n, err := strconv.Atoi(tag)
		if err != nil || n < 1 || n > int(protowire.MaxValidNumber) || (n >= 19000 && n <= 19999) {
			return nil, fmt.Errorf("storecodec: %s.%s: bad field number %q", t, sf.Name, tag)
		}
		if !sf.IsExported() {
			return nil, fmt.Errorf("storecodec: %s.%s: tagged field is not exported", t, sf.Name)
		}
		f := field{num: protowire.Number(n), index: i, name: sf.Name}
		ft := sf.Type
		switch {
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.Uint8:
			f.card = repeated
			f.val, err = elemOf(ft.Elem())
		case ft.Kind() == reflect.Map:
			f.card = mapped
			if f.key, err = elemOf(ft.Key()); err == nil {
				switch f.key.kind {
				case kString, kBool, kInt, kUint:
				default:
					err = fmt.Errorf("map key %s", ft.Key())
				}
			}
			if err == nil {
				f.val, err = elemOf(ft.Elem())
			}
		default:
			f.val, err = elemOf(ft)
		}
		if err != nil {
			return nil, fmt.Errorf("storecodec: %s.%s: unsupported type: %v", t, sf.Name, err)
		}
		if _, dup := p.byNum[f.num]; dup {
			return nil, fmt.Errorf("storecodec: %s: field number %d used twice", t, n)
		}
		p.byNum[f.num] = len(p.fields)
		p.fields = append(p.fields, f)
	}
	sort.Slice(p.fields, func(i, j int) bool { return p.fields[i].num < p.fields[j].num })
	p.dense = make([]int16, 65)
	for i := range p.dense {
		p.dense[i] = -1
	}
	for i, f := range p.fields {
		p.byNum[f.num] = i
		if int(f.num) < len(p.dense) {
			p.dense[f.num] = int16(i)
		}
	}
	actual, _ := plans.LoadOrStore(t, p)
	// Nested message types are planned after this one is stored, so a type
	// that contains itself (through a pointer or a slice) terminates.
	for _, f := range p.fields {
		if f.val.kind == kMessage {
			if _, err := planOf(f.val.typ); err != nil {
				plans.Delete(t)
				return nil, err
			}
		}
	}
	return actual.(*plan), nil
}

func elemOf(t reflect.Type) (elem, error) {
	switch {
	case t == timeType:
		return elem{kind: kTime, typ: t}, nil
	case t == durationType:
		return elem{kind: kDuration, typ: t}, nil
	}
	switch t.Kind() {
	case reflect.String:
		return elem{kind: kString, typ: t}, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return elem{kind: kBytes, typ: t}, nil
		}
	case reflect.Bool:
		return elem{kind: kBool, typ: t}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return elem{kind: kInt, typ: t}, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return elem{kind: kUint, typ: t}, nil
	case reflect.Float64:
		return elem{kind: kDouble, typ: t}, nil
	case reflect.Float32:
		return elem{kind: kFloat, typ: t}, nil
	case reflect.Struct:
		return elem{kind: kMessage, typ: t}, nil
	case reflect.Pointer:
		if t.Elem().Kind() == reflect.Struct && t.Elem() != timeType {
			return elem{kind: kMessage, typ: t.Elem(), ptr: true}, nil
		}
	}
	return elem{}, fmt.Errorf("%s", t)
}

// wireType is how a value of kind k is written as a field of its own.
func (k kind) wireType() protowire.Type {
	switch k {
	case kBool, kInt, kUint:
		return protowire.VarintType
	case kDouble:
		return protowire.Fixed64Type
	case kFloat:
		return protowire.Fixed32Type
	default:
		return protowire.BytesType
	}
}

func (k kind) packable() bool { return k.wireType() != protowire.BytesType }

// ---- encoding ----

func (p *plan) encode(b []byte, v reflect.Value) []byte {
	for i := range p.fields {
		f := &p.fields[i]
		fv := v.Field(f.index)
		switch f.card {
		case single:
			if isZero(f.val, fv) {
				continue
			}
			b = protowire.AppendTag(b, f.num, f.val.kind.wireType())
			b = appendValue(b, f.val, fv)
		case repeated:
			n := fv.Len()
			if n == 0 {
				continue
			}
			if f.val.kind.packable() {
				b = protowire.AppendTag(b, f.num, protowire.BytesType)
				start := len(b)
				b = append(b, 0)
				for j := 0; j < n; j++ {
					b = appendValue(b, f.val, fv.Index(j))
				}
				b = endNested(b, start)
				continue
			}
			for j := 0; j < n; j++ {
				b = protowire.AppendTag(b, f.num, f.val.kind.wireType())
				b = appendValue(b, f.val, fv.Index(j))
			}
		case mapped:
			if fv.Len() == 0 {
				continue
			}
			keys := fv.MapKeys()
			sort.Slice(keys, func(i, j int) bool { return lessKey(f.key, keys[i], keys[j]) })
			for _, k := range keys {
				b = protowire.AppendTag(b, f.num, protowire.BytesType)
				start := len(b)
				b = append(b, 0)
				b = protowire.AppendTag(b, 1, f.key.kind.wireType())
				b = appendValue(b, f.key, k)
				b = protowire.AppendTag(b, 2, f.val.kind.wireType())
				b = appendValue(b, f.val, fv.MapIndex(k))
				b = endNested(b, start)
			}
		}
	}
	return b
}

func isZero(e elem, v reflect.Value) bool {
	switch e.kind {
	case kString, kBytes:
		return v.Len() == 0
	case kBool:
		return !v.Bool()
	case kInt:
		return v.Int() == 0
	case kUint:
		return v.Uint() == 0
	case kDouble, kFloat:
		return math.Float64bits(v.Float()) == 0
	case kTime:
		return timeOf(v).IsZero()
	case kDuration:
		return v.Int() == 0
	case kMessage:
		if e.ptr {
			return v.IsNil()
		}
		return v.IsZero()
	}
	return true
}

// appendValue writes v without its tag (length-prefixed when its wire type
// is bytes).
func appendValue(b []byte, e elem, v reflect.Value) []byte {
	switch e.kind {
	case kString:
		return protowire.AppendString(b, v.String())
	case kBytes:
		return protowire.AppendBytes(b, v.Bytes())
	case kBool:
		return protowire.AppendVarint(b, protowire.EncodeBool(v.Bool()))
	case kInt:
		return protowire.AppendVarint(b, uint64(v.Int()))
	case kUint:
		return protowire.AppendVarint(b, v.Uint())
	case kDouble:
		return protowire.AppendFixed64(b, math.Float64bits(v.Float()))
	case kFloat:
		return protowire.AppendFixed32(b, math.Float32bits(float32(v.Float())))
	case kTime:
		t := timeOf(v)
		return appendSecondsNanos(b, t.Unix(), int64(t.Nanosecond()))
	case kDuration:
		d := time.Duration(v.Int())
		return appendSecondsNanos(b, int64(d/time.Second), int64(d%time.Second))
	case kMessage:
		if e.ptr {
			v = v.Elem()
		}
		p, _ := planOf(e.typ) // planned when the outer type was
		start := len(b)
		return endNested(p.encode(append(b, 0), v), start)
	}
	return b
}

// appendSecondsNanos writes a Timestamp or Duration message body: seconds
// (1) and nanos (2), each omitted when zero.
func appendSecondsNanos(b []byte, sec, nanos int64) []byte {
	start := len(b)
	b = append(b, 0)
	if sec != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(sec))
	}
	if nanos != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(nanos))
	}
	return endNested(b, start)
}

// endNested writes the length of a length-delimited value whose body was
// appended after one byte reserved for its length at b[start], moving the
// body when the length needs more than that byte.
func endNested(b []byte, start int) []byte {
	n := len(b) - start - 1
	if n < 0x80 {
		b[start] = byte(n)
		return b
	}
	size := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, size-1)...)
	copy(b[start+size:], b[start+1:start+1+n])
	protowire.AppendVarint(b[:start], uint64(n))
	return b
}

// timeOf reads a time.Time without copying it to the heap when it can.
func timeOf(v reflect.Value) time.Time {
	if v.CanAddr() {
		return *v.Addr().Interface().(*time.Time)
	}
	return v.Interface().(time.Time)
}

func lessKey(e elem, a, b reflect.Value) bool {
	switch e.kind {
	case kString:
		return a.String() < b.String()
	case kInt:
		return a.Int() < b.Int()
	case kUint:
		return a.Uint() < b.Uint()
	case kBool:
		return !a.Bool() && b.Bool()
	}
	return false
}

// ---- decoding ----

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

func (p *plan) decode(b []byte, v reflect.Value) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return malformed("tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		i := p.field(num)
		if i < 0 {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return malformed("field %d: %v", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		f := &p.fields[i]
		fv := v.Field(f.index)
		var err error
		switch f.card {
		case single:
			if typ != f.val.kind.wireType() {
				return malformed("field %d (%s): wire type %d", num, f.name, typ)
			}
			n, err = consumeValue(b, f.val, fv, true)
		case repeated:
			n, err = decodeRepeated(b, f, typ, fv)
		case mapped:
			if typ != protowire.BytesType {
				return malformed("field %d (%s): wire type %d", num, f.name, typ)
			}
			n, err = decodeEntry(b, f, fv)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		b = b[n:]
	}
	return nil
}

func decodeRepeated(b []byte, f *field, typ protowire.Type, fv reflect.Value) (int, error) {
	if f.val.kind.packable() && typ == protowire.BytesType {
		packed, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, malformed("packed: %v", protowire.ParseError(n))
		}
		for len(packed) > 0 {
			m, err := consumeValue(packed, f.val, grow(fv), false)
			if err != nil {
				fv.SetLen(fv.Len() - 1)
				return 0, err
			}
			packed = packed[m:]
		}
		return n, nil
	}
	if typ != f.val.kind.wireType() {
		return 0, malformed("wire type %d", typ)
	}
	x := grow(fv)
	n, err := consumeValue(b, f.val, x, false)
	if err != nil {
		fv.SetLen(fv.Len() - 1)
		return 0, err
	}
	return n, nil
}

// grow appends a zero element to the slice s and returns it, settable.
func grow(s reflect.Value) reflect.Value {
	n := s.Len()
	if n == s.Cap() {
		s.Grow(1)
	}
	s.SetLen(n + 1)
	x := s.Index(n)
	x.SetZero()
	return x
}

func decodeEntry(b []byte, f *field, fv reflect.Value) (int, error) {
	entry, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, malformed("map entry: %v", protowire.ParseError(n))
	}
	k := reflect.New(f.key.typ).Elem()
	valType := f.val.typ
	if f.val.ptr {
		valType = reflect.PointerTo(f.val.typ)
	}
	val := reflect.New(valType).Elem()
	for len(entry) > 0 {
		num, typ, m := protowire.ConsumeTag(entry)
		if m < 0 {
			return 0, malformed("map entry tag: %v", protowire.ParseError(m))
		}
		entry = entry[m:]
		var err error
		switch {
		case num == 1 && typ == f.key.kind.wireType():
			m, err = consumeValue(entry, f.key, k, true)
		case num == 2 && typ == f.val.kind.wireType():
			m, err = consumeValue(entry, f.val, val, true)
		default:
			m = protowire.ConsumeFieldValue(num, typ, entry)
			if m < 0 {
				err = malformed("map entry field %d: %v", num, protowire.ParseError(m))
			}
		}
		if err != nil {
			return 0, err
		}
		entry = entry[m:]
	}
	if f.val.ptr && val.IsNil() {
		val.Set(reflect.New(f.val.typ))
	}
	if fv.IsNil() {
		fv.Set(reflect.MakeMap(fv.Type()))
	}
	fv.SetMapIndex(k, val)
	return n, nil
}

// consumeValue reads one value of kind e.kind (without its tag) into v and
// returns how many bytes it took. merge says a message merges into what v
// holds (a repeated occurrence of a singular field), as protobuf does.
func consumeValue(b []byte, e elem, v reflect.Value, merge bool) (int, error) {
	switch e.kind {
	case kBool, kInt, kUint:
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, malformed("varint: %v", protowire.ParseError(n))
		}
		switch e.kind {
		case kBool:
			v.SetBool(x != 0)
		case kInt:
			v.SetInt(int64(x))
		default:
			v.SetUint(x)
		}
		return n, nil
	case kDouble:
		x, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return 0, malformed("double: %v", protowire.ParseError(n))
		}
		v.SetFloat(math.Float64frombits(x))
		return n, nil
	case kFloat:
		x, n := protowire.ConsumeFixed32(b)
		if n < 0 {
			return 0, malformed("float: %v", protowire.ParseError(n))
		}
		v.SetFloat(float64(math.Float32frombits(x)))
		return n, nil
	}
	body, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, malformed("length-delimited: %v", protowire.ParseError(n))
	}
	switch e.kind {
	case kString:
		v.SetString(string(body))
	case kBytes:
		v.SetBytes(append([]byte(nil), body...))
	case kTime:
		sec, nanos, err := secondsNanos(body)
		if err != nil {
			return 0, err
		}
		if nanos < 0 || nanos > 999_999_999 {
			return 0, malformed("timestamp nanos %d", nanos)
		}
		*v.Addr().Interface().(*time.Time) = time.Unix(sec, nanos).UTC()
	case kDuration:
		sec, nanos, err := secondsNanos(body)
		if err != nil {
			return 0, err
		}
		if sec > math.MaxInt64/int64(time.Second) || sec < math.MinInt64/int64(time.Second) {
			return 0, malformed("duration of %d seconds", sec)
		}
		v.SetInt(sec*int64(time.Second) + nanos)
	case kMessage:
		p, err := planOf(e.typ)
		if err != nil {
			return 0, err
		}
		target := v
		if e.ptr {
			if v.IsNil() {
				v.Set(reflect.New(e.typ))
			}
			target = v.Elem()
		} else if !merge {
			target.SetZero()
		}
		if err := p.decode(body, target); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// secondsNanos reads a Timestamp or Duration message body.
func secondsNanos(b []byte) (sec, nanos int64, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, malformed("time tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.VarintType {
			x, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return 0, 0, malformed("time field: %v", protowire.ParseError(m))
			}
			if num == 1 {
				sec = int64(x)
			} else {
				nanos = int64(int32(x))
			}
			b = b[m:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, 0, malformed("time field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return sec, nanos, nil
}
