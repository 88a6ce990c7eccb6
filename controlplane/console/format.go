package console

import (
	"bytes"
	"encoding/json"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/printable"
	"github.com/tetherhq/tether/internal/sortedmap"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// enumName turns "NODE_STATE_RUNNING" into "running" given the prefix.
func enumName(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" {
		return ""
	}
	return strings.ToLower(s)
}

func nodeState(s tetherv1.NodeState) string { return enumName(s.String(), "NODE_STATE_") }

func termState(s tetherv1.TerminationState) string {
	return enumName(s.String(), "TERMINATION_STATE_")
}

func grantState(s tetherv1.GrantState) string { return enumName(s.String(), "GRANT_STATE_") }

func roleName(r tetherv1.Role) string { return enumName(r.String(), "ROLE_") }

func templateFuncs() template.FuncMap {
	return template.FuncMap{
		"nodeState":  nodeState,
		"termState":  termState,
		"grantState": grantState,
		"mode":       func(m tetherv1.TerminationMode) string { return enumName(m.String(), "TERMINATION_MODE_") },
		"outcome":    func(o tetherv1.NodeOutcome) string { return enumName(o.String(), "NODE_OUTCOME_") },
		"resolution": func(r tetherv1.CallResolution) string { return enumName(r.String(), "CALL_RESOLUTION_") },
		"callState":  func(s tetherv1.CallState) string { return enumName(s.String(), "CALL_STATE_") },
		"privOutcome": func(o tetherv1.PrivilegeOutcome) string {
			return enumName(o.String(), "PRIVILEGE_OUTCOME_")
		},
		"leaseOutcome":  func(o tetherv1.LeaseOutcome) string { return enumName(o.String(), "LEASE_OUTCOME_") },
		"leaseState":    func(s tetherv1.LeaseState) string { return enumName(s.String(), "LEASE_STATE_") },
		"leaseEndedBy":  leaseEndedBy,
		"result":        func(s tetherv1.TerminalResult) string { return enumName(s.String(), "TERMINAL_RESULT_") },
		"proposalState": func(s tetherv1.ProposalState) string { return enumName(s.String(), "PROPOSAL_STATE_") },
		"rolloutState":  func(s tetherv1.RolloutState) string { return enumName(s.String(), "ROLLOUT_STATE_") },
		"batchState":    func(s tetherv1.RolloutBatchState) string { return enumName(s.String(), "ROLLOUT_BATCH_STATE_") },
		"proposalStop":  proposalStop,
		"jobID":         printable.JobID, // the spaces a page would fold away, written out
		"jobIDs":        jobIDs,
		"ts":            ts,
		"dur":           dur,
		"labels":        labels,
		// more is a record list's rows left out, for "more-rows".
		"more":       func(n int, what, record string) moreRows { return moreRows{n, what, record} },
		"treeBudget": func() int { return treeBudget },
		"join":       strings.Join,
		// seg is an agent's id as one path segment of a link: a job id is
		// the agent's text and may hold "/", "..", "?" or "#", which
		// html/template leaves as they are in a URL's path.
		"seg": url.PathEscape,
		"pct": func(done, total uint32) uint32 {
			if total == 0 {
				return 0
			}
			return done * 100 / total
		},
		"add": func(a, b uint32) uint32 { return a + b },
	}
}

// proposalStop says what approving a stop proposal starts: an abort, or a
// drain and its window. The proposer chose both, and an agent's own
// proposal keeps its windows whoever approves it: a rogue's "stop me now"
// may ask for a day's drain, during which its calls run on.
func proposalStop(p *tetherv1.StopProposal) string {
	if p.Mode == tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		return "an abort"
	}
	if w := p.DrainWindow.AsDuration(); w > 0 {
		return "a drain within " + w.String()
	}
	return "a drain within " + supervisor.DefaultDrainWindow.String() + " (the default)"
}

// ts renders a timestamp in UTC to the second; "—" when unset.
func ts(t *timestamppb.Timestamp) string {
	if t == nil || (t.Seconds == 0 && t.Nanos == 0) {
		return "—"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
}

func dur(d *durationpb.Duration) string {
	if d == nil {
		return "—"
	}
	return d.AsDuration().Round(time.Millisecond).String()
}

// labels renders a label map as "k=v, k2=v2", sorted.
func labels(m map[string]string) string {
	return sortedmap.Join(m, "", ", ", func(k, v string) string { return k + "=" + v })
}

// visible is s with every hidden character written out as Go quotes it
// (\u200b, \u202e, \x1b, \u00a0; internal/printable holds the rule the
// CLI shares). Much of what the console shows was written by the agents it
// reports on — job ids, a stop proposal's reason, a lease's progress and
// terminal detail — and the lease module takes any character but a control
// one in a job id: without this, "job-1\u200b" and "job-1" read alike, and
// a right-to-left override reverses the rest of its cell. Line breaks and
// tabs are shown as such. The console's own templates hold no such
// character, so every page is passed through it whole (render), as is
// every live event (events).
func visible(s string) string { return printable.String(s, "\n\t\r") }

// jobIDs is a list of job ids, each as printable.JobID shows it, comma-separated.
func jobIDs(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = printable.JobID(id)
	}
	return strings.Join(out, ", ")
}

// visibleJSON is v as JSON whose strings are visible: the live pages'
// script puts them into the page as text.
func visibleJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var tree any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // a sequence number stays exact
	if err := d.Decode(&tree); err != nil {
		return nil, err
	}
	var walk func(any) any
	walk = func(x any) any {
		switch x := x.(type) {
		case string:
			return visible(x)
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		case map[string]any:
			for k := range x {
				x[k] = walk(x[k])
			}
		}
		return x
	}
	return json.Marshal(walk(tree))
}

// leaseEndedBy says on whose word a record's lease ended, in words; the
// agent's node id, when an agent's word it was, follows in the template.
func leaseEndedBy(l *tetherv1.RecordLease) string {
	switch l.EndedBy {
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT:
		return "the holder's report"
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_COORDINATOR_RESOLUTION:
		if l.EndedByNodeId == "" {
			return "the coordinator's resolution (an operator)"
		}
		return "the coordinator's resolution, agent"
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_TERMINATION:
		return "the termination"
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_LEASE_DEADLINE:
		return "the lease's own deadline"
	}
	return "—"
}

// moreRows is what the "more-rows" template says of a record page's list:
// N rows of What not drawn, listed whole in Record's JSON.
type moreRows struct {
	N      int
	What   string
	Record string
}

// linked is a value of a request's path or query (an id a page is asked
// for), as a heading or a message names it: that text is the link's, and
// anyone may make a link, so anything but a well-formed Tether id is
// quoted, as the not-found page quotes its path. The console's error page
// read "Could not read node n_x" and, on the lines after, whatever the
// link said ("Your session has expired: sign in at evil.example") in its
// heading and title, as the console's own words; a job id (the agents'
// text) is quoted too.
func linked(s string) string {
	if id.Kind(s) != "" {
		return s
	}
	return strconv.Quote(s)
}
