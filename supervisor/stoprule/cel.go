package stoprule

import (
	"fmt"
	"math"
	"reflect"
	"slices"

	"github.com/google/cel-go/common/types"
	celref "github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// ObservationsType is the CEL name of `observed`'s type. Rules were
// written against tether.v1.StopRuleObservations, so Observations keeps
// that name and its fields keep their proto names and types in CEL: a rule
// reads, type-checks, costs and evaluates as it always did (has() on a
// number is true when it is not zero, on a map when it is not empty, as
// proto3 presence goes).
const ObservationsType = "tether.v1.StopRuleObservations"

// observedField is one field of Observations as CEL sees it.
type observedField struct {
	name string // the proto field name
	typ  *types.Type
	// get returns the field's Go value: int64, float64, string,
	// map[string]int64 or map[string]string.
	get func(*Observations) any
	// set stores a value of the field's Go type (object construction).
	set func(*Observations, any)
	// isSet is proto3 presence: a non-zero number or string, a non-empty
	// map.
	isSet func(*Observations) bool
	// value, when set, is the field as CEL reads it, in place of get's
	// value adapted (toolCounts).
	value func(*Observations) any
	// untracked, with value, is what a lookup of a key reads (a count a
	// map holds, or OtherTool's): untrackedCount or
	// untrackedSubtreeCount.
	untracked func(counts, string) (int64, bool)
}

// celValue is the field of o as CEL reads it.
func (f *observedField) celValue(o *Observations) any {
	if f.value != nil {
		return f.value(o)
	}
	return f.get(o)
}

func intField(name string, p func(*Observations) *int64) observedField {
	return observedField{name: name, typ: types.IntType,
		get:   func(o *Observations) any { return *p(o) },
		set:   func(o *Observations, v any) { *p(o) = v.(int64) },
		isSet: func(o *Observations) bool { return *p(o) != 0 }}
}

func doubleField(name string, p func(*Observations) *float64) observedField {
	return observedField{name: name, typ: types.DoubleType,
		get: func(o *Observations) any { return *p(o) },
		set: func(o *Observations, v any) { *p(o) = v.(float64) },
		// Presence by the bits, as protobuf has it: -0.0 is set.
		isSet: func(o *Observations) bool { return math.Float64bits(*p(o)) != 0 }}
}

func stringField(name string, p func(*Observations) *string) observedField {
	return observedField{name: name, typ: types.StringType,
		get:   func(o *Observations) any { return *p(o) },
		set:   func(o *Observations, v any) { *p(o) = v.(string) },
		isSet: func(o *Observations) bool { return *p(o) != "" }}
}

func countsField(name string, p func(*Observations) *map[string]int64) observedField {
	return observedField{name: name, typ: types.NewMapType(types.StringType, types.IntType),
		get:   func(o *Observations) any { return counts(*p(o)) },
		set:   func(o *Observations, v any) { *p(o) = v.(map[string]int64) },
		isSet: func(o *Observations) bool { return len(*p(o)) > 0 }}
}

// toolCountsField is countsField for a map of counts by tool, which
// tracks MaxTools tools and counts the calls of further ones under
// OtherTool: CEL reads it as toolCounts.
func toolCountsField(name string, p func(*Observations) *map[string]int64) observedField {
	f := countsField(name, p)
	f.value = func(o *Observations) any { return newToolCounts(*p(o)) }
	f.untracked = untrackedCount
	return f
}

// subtreeToolCountsField is countsField for a subtree's counts by tool
// (sumTools): CEL reads it as subtreeToolCounts.
func subtreeToolCountsField(name string, p func(*Observations) *map[string]int64) observedField {
	f := countsField(name, p)
	f.value = func(o *Observations) any { return subtreeToolCounts(*p(o)) }
	f.untracked = untrackedSubtreeCount
	return f
}

func labelsField(name string, p func(*Observations) *map[string]string) observedField {
	return observedField{name: name, typ: types.NewMapType(types.StringType, types.StringType),
		get:   func(o *Observations) any { return *p(o) },
		set:   func(o *Observations, v any) { *p(o) = v.(map[string]string) },
		isSet: func(o *Observations) bool { return len(*p(o)) > 0 }}
}

// observedFields are Observations' fields in proto field-number order.
var observedFields = []observedField{
	intField("calls", func(o *Observations) *int64 { return &o.Calls }),
	toolCountsField("calls_by_tool", func(o *Observations) *map[string]int64 { return &o.CallsByTool }),
	countsField("calls_by_outcome", func(o *Observations) *map[string]int64 { return &o.CallsByOutcome }),
	intField("failures", func(o *Observations) *int64 { return &o.Failures }),
	toolCountsField("failures_by_tool", func(o *Observations) *map[string]int64 { return &o.FailuresByTool }),
	intField("calls_in_flight", func(o *Observations) *int64 { return &o.CallsInFlight }),
	doubleField("call_seconds_total", func(o *Observations) *float64 { return &o.CallSecondsTotal }),
	doubleField("call_seconds_max", func(o *Observations) *float64 { return &o.CallSecondsMax }),
	intField("spawns", func(o *Observations) *int64 { return &o.Spawns }),
	intField("subtree_size", func(o *Observations) *int64 { return &o.SubtreeSize }),
	intField("subtree_depth", func(o *Observations) *int64 { return &o.SubtreeDepth }),
	intField("depth", func(o *Observations) *int64 { return &o.Depth }),
	doubleField("age_seconds", func(o *Observations) *float64 { return &o.AgeSeconds }),
	intField("leases_held", func(o *Observations) *int64 { return &o.LeasesHeld }),
	countsField("leases_by_state", func(o *Observations) *map[string]int64 { return &o.LeasesByState }),
	intField("revocations", func(o *Observations) *int64 { return &o.Revocations }),
	stringField("node_name", func(o *Observations) *string { return &o.NodeName }),
	labelsField("node_labels", func(o *Observations) *map[string]string { return &o.NodeLabels }),
	intField("calls_in_flight_max", func(o *Observations) *int64 { return &o.CallsInFlightMax }),
	intField("subtree_calls", func(o *Observations) *int64 { return &o.SubtreeCalls }),
	intField("subtree_failures", func(o *Observations) *int64 { return &o.SubtreeFailures }),
	subtreeToolCountsField("subtree_calls_by_tool", func(o *Observations) *map[string]int64 { return &o.SubtreeCallsByTool }),
	subtreeToolCountsField("subtree_failures_by_tool", func(o *Observations) *map[string]int64 { return &o.SubtreeFailuresByTool }),
	countsField("subtree_calls_by_outcome", func(o *Observations) *map[string]int64 { return &o.SubtreeCallsByOutcome }),
	doubleField("subtree_call_seconds_total", func(o *Observations) *float64 { return &o.SubtreeCallSecondsTotal }),
	doubleField("subtree_call_seconds_max", func(o *Observations) *float64 { return &o.SubtreeCallSecondsMax }),
	intField("subtree_calls_in_flight", func(o *Observations) *int64 { return &o.SubtreeCallsInFlight }),
	intField("subtree_calls_in_flight_max", func(o *Observations) *int64 { return &o.SubtreeCallsInFlightMax }),
}

var observedByName = func() map[string]*observedField {
	m := make(map[string]*observedField, len(observedFields))
	for i := range observedFields {
		m[observedFields[i].name] = &observedFields[i]
	}
	return m
}()

// observationsType describes Observations to CEL's type registry: it is
// registered as a type (cel.Types), so the checker finds its fields and
// the adapter turns an *Observations into an observedValue.
type observationsType struct{}

// celObservations is the type's CEL value (as `type(observed)` shows it).
var celObservations = types.NewObjectType(ObservationsType)

var observationsReflect = reflect.TypeFor[Observations]()

func (observationsType) TypeName() string          { return ObservationsType }
func (observationsType) HasTrait(int) bool         { return false }
func (observationsType) ReflectType() reflect.Type { return observationsReflect }

func (observationsType) FieldNames() []string {
	names := make([]string, len(observedFields))
	for i, f := range observedFields {
		names[i] = f.name
	}
	return names
}

func (observationsType) FindFieldType(name string) (*types.FieldType, bool) {
	f, ok := observedByName[name]
	if !ok {
		return nil, false
	}
	return &types.FieldType{
		Type:    f.typ,
		IsSet:   func(target any) bool { o := observationsOf(target); return o != nil && f.isSet(o) },
		GetFrom: func(target any) (any, error) { return f.celValue(observationsOrZero(target)), nil },
	}, true
}

// NewValue builds an Observations in an expression
// (tether.v1.StopRuleObservations{calls: 3}).
func (observationsType) NewValue(_ types.Adapter, fields map[string]celref.Val) celref.Val {
	o := &Observations{}
	for name, v := range fields {
		f, ok := observedByName[name]
		if !ok {
			return types.NewErr("no such field: %s", name)
		}
		native, err := v.ConvertToNative(reflect.TypeOf(f.get(&Observations{})))
		if err != nil {
			return types.NewErrFromString(err.Error())
		}
		f.set(o, native)
	}
	return observedValue{o: o}
}

func (observationsType) Adapt(_ types.Adapter, value any) celref.Val {
	o := observationsOf(value)
	if o == nil {
		return types.NullValue
	}
	return observedValue{o: o}
}

func observationsOf(v any) *Observations {
	switch o := v.(type) {
	case *Observations:
		return o
	case Observations:
		return &o
	case observedValue:
		return o.o
	}
	return nil
}

var zeroObservations = &Observations{}

func observationsOrZero(v any) *Observations {
	if o := observationsOf(v); o != nil {
		return o
	}
	return zeroObservations
}

// observedValue is an Observations in an expression.
type observedValue struct{ o *Observations }

func (v observedValue) ConvertToNative(t reflect.Type) (any, error) {
	switch t {
	case reflect.TypeFor[*Observations]():
		return v.o, nil
	case observationsReflect:
		return *v.o, nil
	}
	return nil, fmt.Errorf("type conversion error from '%s' to '%v'", ObservationsType, t)
}

func (v observedValue) ConvertToType(t celref.Type) celref.Val {
	switch {
	case t == types.TypeType:
		return celObservations
	case t.TypeName() == ObservationsType:
		return v
	}
	return types.NewErr("type conversion error from '%s' to '%s'", ObservationsType, t)
}

// Equal is protobuf's equality: field by field, an absent map equal to an
// empty one, a NaN equal to a NaN.
func (v observedValue) Equal(other celref.Val) celref.Val {
	w, ok := other.(observedValue)
	if !ok {
		return types.False
	}
	for i := range observedFields {
		f := &observedFields[i]
		a, b := f.get(v.o), f.get(w.o)
		var eq bool
		switch x := a.(type) {
		case float64:
			y := b.(float64)
			eq = x == y || (math.IsNaN(x) && math.IsNaN(y))
		case counts:
			eq = equalMaps(x, b.(counts))
		case map[string]string:
			eq = equalMaps(x, b.(map[string]string))
		default:
			eq = a == b
		}
		if !eq {
			return types.False
		}
	}
	return types.True
}

func equalMaps[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if y, ok := b[k]; !ok || x != y {
			return false
		}
	}
	return true
}

func (v observedValue) Type() celref.Type { return celObservations }
func (v observedValue) Value() any        { return v.o }

// IsZeroValue: every field is absent.
func (v observedValue) IsZeroValue() bool {
	return !slices.ContainsFunc(observedFields, func(f observedField) bool { return f.isSet(v.o) })
}

// IsSet implements has() on a field named at run time.
func (v observedValue) IsSet(field celref.Val) celref.Val {
	f, err := v.field(field)
	if err != nil {
		return err
	}
	return types.Bool(f.isSet(v.o))
}

// Get reads a field named at run time.
func (v observedValue) Get(field celref.Val) celref.Val {
	f, err := v.field(field)
	if err != nil {
		return err
	}
	return types.DefaultTypeAdapter.NativeToValue(f.celValue(v.o))
}

func (v observedValue) field(field celref.Val) (*observedField, celref.Val) {
	name, ok := field.(types.String)
	if !ok {
		return nil, types.MaybeNoSuchOverloadErr(field)
	}
	f, found := observedByName[string(name)]
	if !found {
		return nil, types.NewErr("no such field '%s'", field)
	}
	return f, nil
}

// counts is a map of counters as CEL reads it.
type counts = map[string]int64

// toolCounts is a map of counts by tool that is full: MaxTools tools
// tracked and the calls of further tools counted under OtherTool. A tool
// it does not track may be among those, so a lookup of it (m[t], m[?t],
// t in m) reads OtherTool's count: a rogue that calls MaxTools harmless
// tools first cannot have a rule on its shell calls read 0 (an
// over-count, never an under-count, errs toward firing). Iteration and
// size are the map's own.
type toolCounts struct {
	traits.Mapper
	other celref.Val
}

// newToolCounts is m as CEL reads it: a plain map while it is not full.
func newToolCounts(m counts) celref.Val {
	plain := types.DefaultTypeAdapter.NativeToValue(m)
	if _, ok := m[OtherTool]; !ok || len(m) < MaxTools {
		return plain
	}
	return toolCounts{Mapper: plain.(traits.Mapper), other: types.Int(m[OtherTool])}
}

// untrackedCount is what toolCounts reads for a tool it may not track: its
// own count, or OtherTool's.
func untrackedCount(m counts, tool string) (int64, bool) {
	if n, ok := m[tool]; ok {
		return n, true
	}
	if n, ok := m[OtherTool]; ok && len(m) >= MaxTools {
		return n, true
	}
	return 0, false
}

func (m toolCounts) Find(key celref.Val) (celref.Val, bool) {
	if v, found := m.Mapper.Find(key); found || !isString(key) {
		return v, found
	}
	return m.other, true
}

func (m toolCounts) Get(key celref.Val) celref.Val {
	if v, found := m.Find(key); found {
		return v
	}
	return m.Mapper.Get(key)
}

func (m toolCounts) Contains(key celref.Val) celref.Val {
	if !isString(key) {
		return m.Mapper.Contains(key)
	}
	return types.True
}

func isString(v celref.Val) bool { _, ok := v.(types.String); return ok }
