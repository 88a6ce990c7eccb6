package storecodec_test

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/storecodec"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Test types with the field numbers of tether.v1 messages: the codec must
// read what the protobuf runtime wrote under those numbers, and write what
// it reads.

type state int32

type exitConfirmation struct {
	By     string    `pb:"1"`
	Kind   string    `pb:"2"`
	At     time.Time `pb:"3"`
	Reason string    `pb:"4"`
}

type contradiction struct {
	Kind   string    `pb:"1"`
	At     time.Time `pb:"2"`
	Detail string    `pb:"3"`
}

type node struct {
	NodeID            string             `pb:"1"`
	ParentNodeID      string             `pb:"2"`
	Ancestors         []string           `pb:"3"`
	Name              string             `pb:"4"`
	Labels            map[string]string  `pb:"5"`
	State             state              `pb:"6"`
	CreatedAt         time.Time          `pb:"7"`
	CreatedBy         string             `pb:"8"`
	LastSeenAt        time.Time          `pb:"9"`
	ExitConfirmations []exitConfirmation `pb:"14"`
	Contradictions    []*contradiction   `pb:"15"`
	Scratch           string             // untagged: not stored
}

type observations struct {
	Calls            int64             `pb:"1"`
	CallsByTool      map[string]int64  `pb:"2"`
	CallSecondsTotal float64           `pb:"7"`
	CallSecondsMax   float64           `pb:"8"`
	AgeSeconds       float64           `pb:"13"`
	NodeName         string            `pb:"17"`
	NodeLabels       map[string]string `pb:"18"`
}

type firing struct {
	Name string `pb:"1"`
}

type proposal struct {
	ProposalID  string        `pb:"1"`
	State       int32         `pb:"5"`
	CreatedAt   time.Time     `pb:"9"`
	Mode        int32         `pb:"11"`
	DrainWindow time.Duration `pb:"12"`
	Rule        *firing       `pb:"13"`
}

type recordLease struct {
	JobID           string `pb:"1"`
	LeaseGeneration uint64 `pb:"3"`
	Outcome         int32  `pb:"5"`
}

var (
	t0 = time.Date(2026, 12, 1, 20, 15, 3, 123456789, time.UTC)
	t1 = time.Date(1969, 7, 20, 20, 17, 40, 5, time.UTC) // before the epoch: negative seconds
)

func fullNode() *node {
	return &node{
		NodeID: "n-1", ParentNodeID: "n-0", Ancestors: []string{"n-root", "", "n-0"},
		Name: "wörker", Labels: map[string]string{"team": "a", "z": "", "": "empty-key"},
		State: 3, CreatedAt: t0, CreatedBy: "operator:ops", LastSeenAt: t1,
		ExitConfirmations: []exitConfirmation{{By: "agent:n-1", Kind: "self", At: t0}, {}},
		Contradictions:    []*contradiction{{Kind: "spawn", At: t1, Detail: "d"}},
	}
}

func fullNodeProto() *tetherv1.Node {
	return &tetherv1.Node{
		NodeId: "n-1", ParentNodeId: "n-0", Ancestors: []string{"n-root", "", "n-0"},
		Name: "wörker", Labels: map[string]string{"team": "a", "z": "", "": "empty-key"},
		State: 3, CreatedAt: timestamppb.New(t0), CreatedBy: "operator:ops", LastSeenAt: timestamppb.New(t1),
		ExitConfirmations: []*tetherv1.ExitConfirmation{{By: "agent:n-1", Kind: "self", At: timestamppb.New(t0)}, {}},
		Contradictions:    []*tetherv1.Contradiction{{Kind: "spawn", At: timestamppb.New(t1), Detail: "d"}},
	}
}

func TestWrittenValuesReadAsTheMessage(t *testing.T) {
	b, err := storecodec.Marshal(fullNode())
	if err != nil {
		t.Fatal(err)
	}
	var got tetherv1.Node
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if want := fullNodeProto(); !proto.Equal(&got, want) {
		t.Fatalf("proto read\n%v\nwant\n%v", &got, want)
	}
}

func TestMessagesReadAsTheValue(t *testing.T) {
	for _, deterministic := range []bool{false, true} {
		b, err := proto.MarshalOptions{Deterministic: deterministic}.Marshal(fullNodeProto())
		if err != nil {
			t.Fatal(err)
		}
		got := node{Scratch: "left over"}
		if err := storecodec.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if want := fullNode(); !reflect.DeepEqual(&got, want) {
			t.Fatalf("read\n%+v\nwant\n%+v", &got, want)
		}
	}
}

func TestScalarsMapsDurationsAndUnsigned(t *testing.T) {
	obs := &observations{Calls: -7, CallsByTool: map[string]int64{"shell": 3, "neg": -1},
		CallSecondsTotal: 1.5, CallSecondsMax: math.Inf(1), AgeSeconds: -0.25, NodeName: "x",
		NodeLabels: map[string]string{"k": "v"}}
	obsProto := &tetherv1.StopRuleObservations{Calls: -7, CallsByTool: map[string]int64{"shell": 3, "neg": -1},
		CallSecondsTotal: 1.5, CallSecondsMax: math.Inf(1), AgeSeconds: -0.25, NodeName: "x",
		NodeLabels: map[string]string{"k": "v"}}
	prop := &proposal{ProposalID: "p", State: 2, CreatedAt: t0, Mode: 1, DrainWindow: -1500 * time.Millisecond, Rule: &firing{}}
	propProto := &tetherv1.StopProposal{ProposalId: "p", State: 2, CreatedAt: timestamppb.New(t0), Mode: 1,
		DrainWindow: durationpb.New(-1500 * time.Millisecond), Rule: &tetherv1.StopRuleFiring{}}
	lease := &recordLease{JobID: "j", LeaseGeneration: math.MaxUint64, Outcome: -1}
	leaseProto := &tetherv1.RecordLease{JobId: "j", LeaseGeneration: math.MaxUint64, Outcome: -1}

	cases := []struct {
		name  string
		value any
		msg   proto.Message
	}{
		{"observations", obs, obsProto},
		{"proposal", prop, propProto},
		{"record lease", lease, leaseProto},
	}
	for _, c := range cases {
		b, err := storecodec.Marshal(c.value)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := c.msg.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !proto.Equal(got, c.msg) {
			t.Fatalf("%s: proto read %v, want %v", c.name, got, c.msg)
		}
		pb, err := proto.Marshal(c.msg)
		if err != nil {
			t.Fatal(err)
		}
		back := reflect.New(reflect.TypeOf(c.value).Elem())
		if err := storecodec.Unmarshal(pb, back.Interface()); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(back.Interface(), c.value) {
			t.Fatalf("%s: read %+v, want %+v", c.name, back.Interface(), c.value)
		}
	}
}

func TestZeroValueIsEmptyAndUntaggedFieldsAreNotStored(t *testing.T) {
	b, err := storecodec.Marshal(node{Scratch: "not stored"})
	if err != nil || len(b) != 0 {
		t.Fatalf("Marshal(zero) = %x, %v; want empty", b, err)
	}
}

func TestUnknownFieldsAreSkipped(t *testing.T) {
	// A newer writer's Node has fields this reader's type does not.
	b, err := proto.Marshal(&tetherv1.Node{NodeId: "n", ExitedAt: timestamppb.New(t0), TerminationId: "t",
		OpenSessions: []*tetherv1.OpenSession{{SessionId: "s"}}})
	if err != nil {
		t.Fatal(err)
	}
	var got node
	if err := storecodec.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "n" {
		t.Fatalf("NodeID = %q", got.NodeID)
	}
}

func TestMalformedInputIsAnError(t *testing.T) {
	good, _ := storecodec.Marshal(fullNode())
	bad := [][]byte{
		{0x0a, 0x05, 'a'},        // length beyond the end
		{0x08},                   // varint missing
		{0x32, 0x01, 0x00},       // field 6 (an enum) as bytes
		{0x0a | 0x00, 0x80},      // truncated length varint
		{0x3a, 0x02, 0x10, 0x7f}, // field 7 (timestamp) with nanos 127... fine, then:
		{0x3a, 0x06, 0x10, 0xff, 0xff, 0xff, 0xff, 0x0f}, // nanos -1
		good[:len(good)-1],
	}
	for i, b := range bad {
		var n node
		err := storecodec.Unmarshal(b, &n)
		if i == 4 {
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			continue
		}
		if !errors.Is(err, storecodec.ErrMalformed) {
			t.Fatalf("case %d (%x): err = %v, want ErrMalformed", i, b, err)
		}
	}
}

func TestUnsupportedTypesAreRefused(t *testing.T) {
	type withChan struct {
		C chan int `pb:"1"`
	}
	type badNumber struct {
		S string `pb:"0"`
	}
	type twice struct {
		A string `pb:"1"`
		B string `pb:"1"`
	}
	for _, v := range []any{&withChan{}, &badNumber{}, &twice{}} {
		if _, err := storecodec.Marshal(v); err == nil {
			t.Fatalf("Marshal(%T) succeeded", v)
		}
		if err := storecodec.Unmarshal(nil, v); err == nil {
			t.Fatalf("Unmarshal into %T succeeded", v)
		}
	}
	if err := storecodec.Unmarshal(nil, node{}); err == nil {
		t.Fatal("Unmarshal into a non-pointer succeeded")
	}
}

// A type that contains itself plans and round-trips.
type tree struct {
	Name     string  `pb:"1"`
	Children []*tree `pb:"2"`
}

func TestRecursiveTypes(t *testing.T) {
	in := &tree{Name: "a", Children: []*tree{{Name: "b", Children: []*tree{{Name: "c"}}}, {}}}
	b, err := storecodec.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out tree
	if err := storecodec.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&out, in) {
		t.Fatalf("got %+v", out)
	}
}

func FuzzUnmarshal(f *testing.F) {
	good, _ := storecodec.Marshal(fullNode())
	f.Add(good)
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var n node
		if err := storecodec.Unmarshal(b, &n); err != nil {
			return
		}
		// Whatever decodes re-encodes to something that decodes the same.
		again, err := storecodec.Marshal(&n)
		if err != nil {
			t.Fatal(err)
		}
		var m node
		if err := storecodec.Unmarshal(again, &m); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(&m, &n) {
			t.Fatalf("re-read %+v, want %+v", m, n)
		}
	})
}

func BenchmarkNode(b *testing.B) {
	n := fullNode()
	p := fullNodeProto()
	enc, _ := storecodec.Marshal(n)
	b.Run("storecodec/marshal", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, _ = storecodec.Marshal(n)
		}
	})
	b.Run("proto/marshal", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			_, _ = proto.Marshal(p)
		}
	})
	b.Run("storecodec/unmarshal", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var x node
			_ = storecodec.Unmarshal(enc, &x)
		}
	})
	b.Run("proto/unmarshal", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var x tetherv1.Node
			_ = proto.Unmarshal(enc, &x)
		}
	})
}
