package wire

import (
	"bufio"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/capability"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/rollout"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/conv.golden from the current conversions")

// filler sets every exported field of a value, each scalar to a value of
// its own: strings and plain numbers count up, named integers (the enums)
// are 1, times are t0 plus whole seconds, durations whole milliseconds,
// slices and maps get two elements, pointers a filled value.
type filler struct{ n int }

var (
	timeType     = reflect.TypeFor[time.Time]()
	durationType = reflect.TypeFor[time.Duration]()
)

func (f *filler) fill(v reflect.Value) {
	f.n++
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == timeType {
			v.Set(reflect.ValueOf(t0.Add(time.Duration(f.n) * time.Second)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i))
			}
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := 0; i < 2; i++ {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Array:
		for i := 0; i < v.Len(); i++ {
			f.fill(v.Index(i))
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for i := 0; i < 2; i++ {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			f.fill(k)
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", f.n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		switch {
		case v.Type() == durationType:
			v.SetInt(int64(f.n) * int64(time.Millisecond))
		case v.Type().PkgPath() != "":
			v.SetInt(1)
		default:
			v.SetInt(int64(f.n))
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Type().PkgPath() != "" {
			v.SetUint(1)
		} else {
			v.SetUint(uint64(f.n))
		}
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(f.n) + 0.5)
	}
}

// full is a T with every exported field set.
func full[T any]() T {
	var v T
	(&filler{}).fill(reflect.ValueOf(&v).Elem())
	return v
}

// wireBytes is m's deterministic protobuf encoding in hex: presence is
// visible (an empty Duration is written, an absent one is not).
func wireBytes(m proto.Message) string {
	if reflect.ValueOf(m).IsNil() {
		return "nil"
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "error: " + err.Error()
	}
	return hex.EncodeToString(b)
}

func wireList[M proto.Message](ms []M) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = wireBytes(m)
	}
	return fmt.Sprintf("%d[%s]", len(ms), strings.Join(out, ","))
}

// conversions is every conversion of the package applied to a fully
// populated and to a zero value (and the reverse ones to those
// messages): the golden file holds what they produced before the
// conversions were generated, so a generated conversion sends the same
// bytes.
func conversions() map[string]string {
	out := map[string]string{}
	to := func(name string, full, zero string) {
		out[name+"/full"], out[name+"/zero"] = full, zero
	}
	node, call, prop, rec := full[tree.Node](), full[ledger.ToolCall](), full[supervisor.StopProposal](), full[supervisor.ReconciliationRecord]()
	to("Node", wireBytes(Node(&node)), wireBytes(Node(&tree.Node{})))
	out["Node/nil"] = wireBytes(Node(nil))
	to("Nodes", wireList(Nodes([]*tree.Node{&node, &node})), wireList(Nodes(nil)))
	to("Contradiction", wireBytes(Contradiction(full[tree.Contradiction]())), wireBytes(Contradiction(tree.Contradiction{})))
	sig := full[tree.SessionSignal]()
	to("SessionSignal", wireBytes(SessionSignal(&sig)), wireBytes(SessionSignal(&tree.SessionSignal{})))
	to("ToolCall", wireBytes(ToolCall(&call)), wireBytes(ToolCall(&ledger.ToolCall{})))
	to("ToolCalls", wireList(ToolCalls([]*ledger.ToolCall{&call})), wireList(ToolCalls(nil)))
	to("Proposal", wireBytes(Proposal(&prop)), wireBytes(Proposal(&supervisor.StopProposal{})))
	to("Proposals", wireList(Proposals([]*supervisor.StopProposal{&prop})), wireList(Proposals(nil)))
	fir := full[supervisor.StopRuleFiring]()
	to("StopRuleFiring", wireBytes(StopRuleFiring(&fir)), wireBytes(StopRuleFiring(&supervisor.StopRuleFiring{})))
	to("StopRuleValues", wireList(StopRuleValues(fir.Values)), wireList(StopRuleValues(nil)))
	to("Record", wireBytes(Record(&rec)), wireBytes(Record(&supervisor.ReconciliationRecord{})))
	to("Records", wireList(Records([]*supervisor.ReconciliationRecord{&rec})), wireList(Records(nil)))
	to("RecordNode", wireBytes(RecordNode(&rec.Nodes[0])), wireBytes(RecordNode(&supervisor.RecordNode{})))
	to("RecordToolCall", wireBytes(RecordToolCall(&rec.ToolCalls[0])), wireBytes(RecordToolCall(&supervisor.RecordToolCall{})))
	to("RecordPrivilege", wireBytes(RecordPrivilege(&rec.Privileges[0])), wireBytes(RecordPrivilege(&supervisor.RecordPrivilege{})))
	to("RecordLease", wireBytes(RecordLease(&rec.Leases[0])), wireBytes(RecordLease(&supervisor.RecordLease{})))
	rule, obs := full[stoprule.Rule](), full[stoprule.Observations]()
	to("StopRule", wireBytes(StopRule(&rule)), wireBytes(StopRule(&stoprule.Rule{})))
	to("StopRules", wireList(StopRules([]*stoprule.Rule{&rule})), wireList(StopRules(nil)))
	to("StopRuleObservations", wireBytes(StopRuleObservations(&obs)), wireBytes(StopRuleObservations(&stoprule.Observations{})))
	grant, tomb := full[capability.Grant](), full[capability.Tombstone]()
	to("Grant", wireBytes(Grant(grant)), wireBytes(Grant(capability.Grant{})))
	to("Tombstone", wireBytes(Tombstone(tomb)), wireBytes(Tombstone(capability.Tombstone{})))
	l, row, pol := full[lease.Lease](), full[coordinator.Row](), full[lease.Policy]()
	to("Lease", wireBytes(Lease(l)), wireBytes(Lease(lease.Lease{})))
	to("Decision", wireBytes(Decision(full[lease.Decision]())), wireBytes(Decision(lease.Decision{})))
	to("EvidenceRow", wireBytes(EvidenceRow(row)), wireBytes(EvidenceRow(coordinator.Row{})))
	sc := full[coordinator.StaleCount]()
	to("StaleCounts", wireList(StaleCounts([]coordinator.StaleCount{sc})), wireList(StaleCounts(nil)))
	to("StaleCount", wireBytes(StaleCount(sc)), wireBytes(StaleCount(coordinator.StaleCount{})))
	to("LeasePolicy", wireBytes(LeasePolicy(pol)), wireBytes(LeasePolicy(lease.Policy{})))
	to("Rollout", wireBytes(Rollout(full[rollout.Rollout]())), wireBytes(Rollout(rollout.Rollout{})))

	// The reverse conversions, of the messages above, of an empty message
	// and of nil.
	from := func(name string, full, empty, none any) {
		out[name+"/full"], out[name+"/empty"], out[name+"/nil"] = fmt.Sprintf("%+v", full), fmt.Sprintf("%+v", empty), fmt.Sprintf("%+v", none)
	}
	from("StopRuleFromProto", StopRuleFromProto(StopRule(&rule)), StopRuleFromProto(&tetherv1.StopRule{}), StopRuleFromProto(nil))
	from("StopRuleObservationsFromProto", StopRuleObservationsFromProto(StopRuleObservations(&obs)),
		StopRuleObservationsFromProto(&tetherv1.StopRuleObservations{}), StopRuleObservationsFromProto(nil))
	from("GrantFromProto", GrantFromProto(Grant(grant)), GrantFromProto(&tetherv1.Grant{}), GrantFromProto(nil))
	from("EvidenceRowFromProto", EvidenceRowFromProto(EvidenceRow(row)), EvidenceRowFromProto(&tetherv1.EvidenceRow{}), EvidenceRowFromProto(nil))
	return out
}

// TestConversionsSendWhatThePreviousVersionSent: every conversion, in
// both directions, of a fully populated and of a zero value gives exactly
// what the hand-written conversions gave (testdata/conv.golden, written by
// them; -update rewrites it, which a change of behaviour must justify).
func TestConversionsSendWhatThePreviousVersionSent(t *testing.T) {
	got := conversions()
	names := make([]string, 0, len(got))
	for k := range got {
		names = append(names, k)
	}
	sort.Strings(names)
	const path = "testdata/conv.golden"
	if *updateGolden {
		var b strings.Builder
		for _, k := range names {
			fmt.Fprintf(&b, "%s %s\n", k, got[k])
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		want[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range names {
		if w, ok := want[k]; !ok {
			t.Errorf("%s: not in %s (run with -update once the output is checked)", k, path)
		} else if got[k] != w {
			t.Errorf("%s changed:\n got %s\nwant %s", k, got[k], w)
		}
	}
	if len(want) != len(got) {
		t.Errorf("%s holds %d conversions, the test makes %d", path, len(want), len(got))
	}
}
