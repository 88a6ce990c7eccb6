package stoprule_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Transcript tests replay stop-rule scenarios from testdata/*.txt against
// the pure core: the attenuation rule, the observation folding and
// evaluation. Lines ('#' starts a comment):
//
//	node NAME [< PARENT] [label k=v ...]        a node (spawned under PARENT: its ancestors' counters move)
//	add RULE by ACTOR on NODE|selector k=v: EXPR attach a rule (ACTOR: a node name, or operator)
//	remove RULE by ACTOR
//	=> ok | denied | duplicate | invalid [~ text]  the outcome of the add or remove before it
//	effect NODE => RULE[(inherited)|(selector)] ...  the rules in effect at NODE, by name
//	call NODE TOOL completed|failed DURATION    a call begun and ended (folded as the ledger does)
//	reject NODE TOOL                            a call refused because the node is stopping
//	report NODE k=v ...                         self-reported counters (each replaces the last)
//	eval NODE => RULE ...                       exactly these rules in effect at NODE are true
//	values RULE name=value ...                  the values the rule read at the last eval ('*': self-reported)
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTranscript(t, f) })
	}
}

type world struct {
	nodes    map[string]*tree.Node
	obs      map[string]*stoprule.Observations
	self     map[string]map[string]float64
	rules    []*stoprule.Rule
	lastEval map[string]stoprule.Result
	begun    map[string][]*ledger.ToolCall // calls begun and not ended, by node
	last     error
	seq      int
}

var epoch = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func (w *world) actor(name string) stoprule.Actor {
	if name == "operator" {
		return stoprule.Actor{ID: "operator:admin"}
	}
	return stoprule.Actor{ID: "agent:" + name, NodeID: name}
}

func (w *world) node(t *testing.T, name string) *tree.Node {
	n, ok := w.nodes[name]
	if !ok {
		t.Fatalf("no node %q", name)
	}
	return n
}

func (w *world) observed(name string) *stoprule.Observations {
	if w.obs[name] == nil {
		w.obs[name] = &stoprule.Observations{}
	}
	return w.obs[name]
}

// add runs the checks the shell runs, in its order.
func (w *world) add(a stoprule.Actor, r *stoprule.Rule) error {
	if err := stoprule.Validate(r); err != nil {
		return err
	}
	if _, err := stoprule.Compile(r.Expression); err != nil {
		return err
	}
	var target *tree.Node
	if r.NodeID != "" {
		target = w.nodes[r.NodeID]
	}
	if err := stoprule.CheckAttach(a, target); err != nil {
		return err
	}
	var inEffect []*stoprule.Rule
	for _, o := range w.rules {
		if (target != nil && stoprule.Applies(o, target)) || (target == nil && o.Name == r.Name) {
			inEffect = append(inEffect, o)
		}
	}
	if err := stoprule.CheckName(inEffect, r.Name); err != nil {
		return err
	}
	r.SetBy = a.ID
	w.rules = append(w.rules, r)
	return nil
}

func (w *world) remove(a stoprule.Actor, name string) error {
	for i, r := range w.rules {
		if r.Name != name {
			continue
		}
		if err := stoprule.CheckRemove(a, r, w.nodes[stoprule.SetterNode(r)]); err != nil {
			return err
		}
		w.rules = append(w.rules[:i], w.rules[i+1:]...)
		return nil
	}
	return stoprule.ErrRuleNotFound
}

func runTranscript(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &world{nodes: map[string]*tree.Node{}, obs: map[string]*stoprule.Observations{}, self: map[string]map[string]float64{}, begun: map[string][]*ledger.ToolCall{}}
	sc := bufio.NewScanner(f)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s: "+format, append([]any{path, lineNo, line}, args...)...)
		}
		if strings.HasPrefix(line, "=>") {
			checkOutcome(t, fail, w.last, strings.TrimSpace(strings.TrimPrefix(line, "=>")))
			continue
		}
		head, expect, hasExpect := strings.Cut(line, "=>")
		fields := strings.Fields(head)
		switch fields[0] {
		case "node":
			n := &tree.Node{NodeID: fields[1], Name: fields[1], Labels: map[string]string{}, CreatedAt: epoch,
				State: tree.NodeStateRunning}
			rest := fields[2:]
			if len(rest) >= 2 && rest[0] == "<" {
				p := w.node(t, rest[1])
				n.ParentNodeID, n.Ancestors = p.NodeID, append(append([]string(nil), p.Ancestors...), p.NodeID)
				rest = rest[2:]
				stoprule.ApplySpawn(n, w.observed)
			}
			if len(rest) > 0 && rest[0] == "label" {
				for _, kv := range rest[1:] {
					k, v, _ := strings.Cut(kv, "=")
					n.Labels[k] = v
				}
			}
			w.nodes[n.NodeID] = n
		case "add":
			spec, expr, ok := strings.Cut(line, ":")
			if !ok {
				fail("want ': EXPR'")
			}
			s := strings.Fields(spec)
			r := &stoprule.Rule{RuleID: "r" + strconv.Itoa(w.seq), Name: s[1], Expression: strings.TrimSpace(expr)}
			w.seq++
			if s[5] == "selector" {
				k, v, _ := strings.Cut(s[6], "=")
				r.Selector = map[string]string{k: v}
			} else {
				r.NodeID = s[5]
			}
			w.last = w.add(w.actor(s[3]), r)
		case "remove":
			w.last = w.remove(w.actor(fields[3]), fields[1])
		default:
			switch fields[0] {
			case "effect":
				var got []string
				for _, r := range stoprule.InEffect(w.rules, w.node(t, fields[1])) {
					switch {
					case r.NodeID == "":
						got = append(got, r.Name+"(selector)")
					case r.Inherited:
						got = append(got, r.Name+"(inherited)")
					default:
						got = append(got, r.Name)
					}
				}
				sort.Strings(got)
				if want := strings.Fields(expect); strings.Join(got, " ") != strings.Join(want, " ") || !hasExpect {
					fail("in effect: %v, want %v", got, want)
				}
			case "call", "reject":
				n := fields[1]
				call := &ledger.ToolCall{CallID: "c", NodeID: n, Tool: fields[2], State: ledger.CallStateInFlight, BegunAt: epoch}
				if fields[0] == "reject" {
					call.State, call.Resolution = ledger.CallStateEnded, ledger.CallResolutionRejectedDraining
					stoprule.ApplyCall(w.observed(n), nil, call)
					continue
				}
				stoprule.ApplyCall(w.observed(n), nil, call)
				begun := call.State
				d, err := time.ParseDuration(fields[4])
				if err != nil {
					fail("duration: %v", err)
				}
				call.State, call.EndedAt = ledger.CallStateEnded, epoch.Add(d)
				call.Resolution = map[string]ledger.CallResolution{"completed": ledger.CallResolutionCompleted, "failed": ledger.CallResolutionFailed}[fields[3]]
				stoprule.ApplyCall(w.observed(n), &ledger.ToolCall{State: begun}, call)
			case "begin": // begin NODE TOOL: a call that stays in flight
				call := &ledger.ToolCall{CallID: "c", NodeID: fields[1], Tool: fields[2], State: ledger.CallStateInFlight, BegunAt: epoch}
				stoprule.ApplyCall(w.observed(fields[1]), nil, call)
				w.begun[fields[1]] = append(w.begun[fields[1]], call)
			case "end": // end NODE completed|failed: the node's last begun call ends
				calls := w.begun[fields[1]]
				if len(calls) == 0 {
					fail("no call in flight at %s", fields[1])
				}
				before := calls[len(calls)-1]
				w.begun[fields[1]] = calls[:len(calls)-1]
				after := *before
				after.State, after.EndedAt = ledger.CallStateEnded, epoch.Add(time.Second)
				after.Resolution = map[string]ledger.CallResolution{"completed": ledger.CallResolutionCompleted, "failed": ledger.CallResolutionFailed}[fields[2]]
				stoprule.ApplyCall(w.observed(fields[1]), before, &after)
			case "report":
				if w.self[fields[1]] == nil {
					w.self[fields[1]] = map[string]float64{}
				}
				for _, kv := range fields[2:] {
					k, v, _ := strings.Cut(kv, "=")
					x, err := strconv.ParseFloat(v, 64)
					if err != nil {
						fail("%v", err)
					}
					w.self[fields[1]][k] = x
				}
				if err := stoprule.CheckCounters(w.self[fields[1]]); err != nil {
					fail("%v", err)
				}
			case "eval":
				n := w.node(t, fields[1])
				snap := stoprule.Snapshot(w.obs[n.NodeID], n, epoch.Add(time.Hour))
				w.lastEval = map[string]stoprule.Result{}
				var fired []string
				for _, r := range stoprule.InEffect(w.rules, n) {
					c, err := stoprule.Compile(r.Expression)
					if err != nil {
						fail("%v", err)
					}
					res := c.Evaluate(snap, w.self[n.NodeID])
					if res.Err != nil {
						fail("rule %s: %v", r.Name, res.Err)
					}
					if res.Cost > stoprule.CostBudget {
						fail("rule %s cost %d", r.Name, res.Cost)
					}
					w.lastEval[r.Name] = res
					if res.Fired {
						fired = append(fired, r.Name)
					}
				}
				sort.Strings(fired)
				if want := strings.Fields(expect); strings.Join(fired, " ") != strings.Join(want, " ") || !hasExpect {
					fail("fired %v, want %v", fired, want)
				}
			case "values":
				res, ok := w.lastEval[fields[1]]
				if !ok {
					fail("rule %s was not evaluated", fields[1])
				}
				var got []string
				for _, v := range res.Values {
					s := v.Name + "=" + v.Value
					if v.SelfReported {
						s += "*"
					}
					got = append(got, s)
				}
				if strings.Join(got, " ") != strings.Join(fields[2:], " ") {
					fail("values %v", got)
				}
				if res.SelfReported() != strings.HasSuffix(line, "*") {
					fail("self-reported %v", res.SelfReported())
				}
			default:
				fail("unknown command")
			}
		}
	}
}

func checkOutcome(t *testing.T, fail func(string, ...any), err error, want string) {
	t.Helper()
	kind, text, _ := strings.Cut(want, "~")
	kind, text = strings.TrimSpace(kind), strings.TrimSpace(text)
	sentinel := map[string]error{"denied": stoprule.ErrDenied, "duplicate": stoprule.ErrDuplicate, "invalid": stoprule.ErrInvalidRule}[kind]
	switch {
	case kind == "ok" && err != nil:
		fail("%v, want ok", err)
	case kind != "ok" && (sentinel == nil || !errors.Is(err, sentinel)):
		fail("%v, want %s", err, kind)
	case text != "" && !strings.Contains(err.Error(), text):
		fail("%v, want it to mention %q", err, text)
	}
}
