package stoprule_test

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/storecodec"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/stoprule"
)

// Stored rules and counters keep the bytes of the tether.v1 messages the
// previous version stored: what the store codec writes decodes as the
// message the edge converts the value to, and what the previous version
// wrote (proto.Marshal of that message) decodes as the same value.

func drawLabels(t *rapid.T, label string) map[string]string {
	return rapid.MapOfN(rapid.StringMatching(`[a-z]{1,6}`), rapid.String(), 0, 3).Draw(t, label)
}

func drawCounts(t *rapid.T, label string) map[string]int64 {
	return rapid.MapOfN(rapid.StringMatching(`[a-z_]{1,8}`), rapid.Int64(), 0, 3).Draw(t, label)
}

func drawRule(t *rapid.T) *stoprule.Rule {
	r := &stoprule.Rule{
		RuleID: rapid.String().Draw(t, "rule_id"), Name: rapid.String().Draw(t, "name"),
		Expression: rapid.String().Draw(t, "expression"), Action: rapid.String().Draw(t, "action"),
		SetBy: rapid.String().Draw(t, "set_by"), NodeID: rapid.String().Draw(t, "node_id"),
		Selector: drawLabels(t, "selector"), Severity: rapid.String().Draw(t, "severity"), Labels: drawLabels(t, "labels"),
		Description: rapid.String().Draw(t, "description"), Inherited: rapid.Bool().Draw(t, "inherited"),
	}
	if rapid.Bool().Draw(t, "created") {
		r.CreatedAt = time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "created_at"), rapid.Int64Range(0, 999_999_999).Draw(t, "nanos")).UTC()
	}
	return r
}

func drawObservations(t *rapid.T) *stoprule.Observations {
	return &stoprule.Observations{
		Calls: rapid.Int64().Draw(t, "calls"), CallsByTool: drawCounts(t, "calls_by_tool"), CallsByOutcome: drawCounts(t, "calls_by_outcome"),
		Failures: rapid.Int64().Draw(t, "failures"), FailuresByTool: drawCounts(t, "failures_by_tool"),
		CallsInFlight: rapid.Int64().Draw(t, "in_flight"), CallsInFlightMax: rapid.Int64().Draw(t, "in_flight_max"), CallSecondsTotal: rapid.Float64().Draw(t, "total"),
		CallSecondsMax: rapid.Float64().Draw(t, "max"), Spawns: rapid.Int64().Draw(t, "spawns"),
		SubtreeSize: rapid.Int64().Draw(t, "subtree_size"), SubtreeDepth: rapid.Int64().Draw(t, "subtree_depth"),
		Depth: rapid.Int64().Draw(t, "depth"), AgeSeconds: rapid.Float64().Draw(t, "age"),
		LeasesHeld: rapid.Int64().Draw(t, "leases_held"), LeasesByState: drawCounts(t, "leases_by_state"),
		Revocations: rapid.Int64().Draw(t, "revocations"), NodeName: rapid.String().Draw(t, "node_name"),
		NodeLabels: drawLabels(t, "node_labels"),
	}
}

// emptyIsNil: an empty map and an absent one are one stored value.
func emptyIsNil(v any) any {
	rv := reflect.ValueOf(v).Elem()
	c := reflect.New(rv.Type()).Elem()
	c.Set(rv)
	for i := range c.NumField() {
		if f := c.Field(i); f.Kind() == reflect.Map && f.Len() == 0 {
			f.SetZero()
		}
	}
	return c.Interface()
}

// compatible checks one value both ways: stored by the codec, it is the
// message the edge converts it to; stored as that message by the previous
// version, it reads back as the value.
func compatible[T any](t *rapid.T, v *T, edge func(*T) proto.Message, fresh proto.Message) {
	raw, err := storecodec.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	m := fresh.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(raw, m); err != nil {
		t.Fatalf("stored %T does not decode as %T: %v", v, m, err)
	}
	if want := edge(v); !proto.Equal(m, want) {
		t.Fatalf("stored %T decodes as\n%v\nthe edge converts it to\n%v", v, m, want)
	}
	old, err := proto.Marshal(edge(v))
	if err != nil {
		t.Fatal(err)
	}
	back := new(T)
	if err := storecodec.Unmarshal(old, back); err != nil {
		t.Fatalf("a %T the previous version stored does not decode: %v", v, err)
	}
	if got, want := emptyIsNil(back), emptyIsNil(v); !reflect.DeepEqual(got, want) {
		t.Fatalf("a %T the previous version stored reads as\n%+v\nwant\n%+v", v, got, want)
	}
}

func TestStoredRulesKeepTheirBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		compatible(t, drawRule(t), func(r *stoprule.Rule) proto.Message { return wire.StopRule(r) }, &tetherv1.StopRule{})
	})
}

func TestStoredObservationsKeepTheirBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		compatible(t, drawObservations(t), func(o *stoprule.Observations) proto.Message { return wire.StopRuleObservations(o) },
			&tetherv1.StopRuleObservations{})
	})
}

// TestEdgeConversionsAreInverse: what the edge renders converts back to the
// same value (the conversion loses nothing).
func TestEdgeConversionsAreInverse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r, o := drawRule(t), drawObservations(t)
		if got := wire.StopRuleFromProto(wire.StopRule(r)); !reflect.DeepEqual(got, r) {
			t.Fatalf("rule %+v comes back as %+v", r, got)
		}
		if got := wire.StopRuleObservationsFromProto(wire.StopRuleObservations(o)); !reflect.DeepEqual(got, o) {
			t.Fatalf("observations %+v come back as %+v", o, got)
		}
	})
}

// BenchmarkObservationsCodec: a node's counters stored and read by the
// store codec (each tool call's transaction reads and writes them once),
// and as the previous version did, in one run.
func BenchmarkObservationsCodec(b *testing.B) {
	o := &stoprule.Observations{
		Calls: 120, CallsByTool: map[string]int64{"shell": 70, "http": 40, "sql": 10}, CallsByOutcome: map[string]int64{"completed": 100, "failed": 9},
		Failures: 9, FailuresByTool: map[string]int64{"http": 9}, CallsInFlight: 2, CallsInFlightMax: 5, CallSecondsTotal: 812.5, CallSecondsMax: 31,
	}
	raw, err := storecodec.Marshal(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("storecodec/encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := storecodec.Marshal(o); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto/encode", func(b *testing.B) {
		m := wire.StopRuleObservations(o)
		for b.Loop() {
			if _, err := proto.Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("storecodec/decode", func(b *testing.B) {
		for b.Loop() {
			var got stoprule.Observations
			if err := storecodec.Unmarshal(raw, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto/decode", func(b *testing.B) {
		for b.Loop() {
			var m tetherv1.StopRuleObservations
			if err := proto.Unmarshal(raw, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
