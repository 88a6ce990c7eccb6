package console

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/printable"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

// ---- the agent tree ----

// treeNode is one node of the rendered tree.
type treeNode struct {
	Node     *tetherv1.Node
	Children []*treeNode
	// ChildCount is the node's number of children, as the tree stores it
	// (HasCount false: not stored, it may have some).
	ChildCount uint64
	HasCount   bool
	// More links to the page of its children after those shown; Unread:
	// its children were not read on this page (a link opens them).
	More   string
	Unread bool
	Open   bool
}

type treeData struct {
	Roots   []*treeNode
	Matches []*tetherv1.Node // when filtered: a flat list
	// Paths: each match's ancestors by name, root first ("-" for a root),
	// as agentsdk.AncestorPaths names them.
	Paths    map[string]string
	Filtered bool
	Total    int // the nodes shown
	Selector string
	State    string
	Root     string
	RootName string // the name of the node Root names
	Next     string // the next page's link, when there is one
	Paged    bool   // a page after the first
	Counts   map[string]int
}

// The tree page reads and renders one level at a time, a page of each
// (ListNodes one_level), breadth first, up to treeBudget nodes and
// treeCalls listings; the children it did not read are a link away
// (?root=, ?after=). Its cost is bounded whatever a rogue spawns below.
// The filtered view shows a page of matches (filterPage) at a time.
const (
	treeBudget  = 500
	treeCalls   = 40
	filterPage  = 500
	filterCalls = 10
	// nodeChildren: the children a node's page lists.
	nodeChildren = 200
)

func (c *Console) tree(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	q := r.URL.Query()
	d := treeData{Selector: q.Get("selector"), State: q.Get("state"), Root: q.Get("root"), Counts: map[string]int{}}
	after := q.Get("after")
	d.Paged = after != ""
	var rootNode *tetherv1.Node
	if d.Root != "" {
		got, ok := apiCall(ctx, c, w, r, s, "Could not read node "+linked(d.Root), s.clients.Agent.GetNode, &tetherv1.GetNodeRequest{NodeId: d.Root})
		if !ok {
			return
		}
		rootNode = got.Msg.Node
		if err := answered("node", d.Root, rootNode.GetNodeId(), rootNode != nil); err != nil {
			c.apiFail(w, r, s, "Could not read node "+linked(d.Root), err)
			return
		}
		d.RootName = rootNode.Name
	}
	if d.Selector != "" || d.State != "" {
		c.filteredTree(ctx, w, r, s, &d, after)
		return
	}
	link := func(root, after string) string {
		v := url.Values{}
		if root != "" {
			v.Set("root", root)
		}
		if after != "" {
			v.Set("after", after)
		}
		return "/ui/tree?" + v.Encode()
	}
	// The first level: the roots, or the named node's children.
	resp, ok := apiCall(ctx, c, w, r, s, "Could not list the agent tree", s.clients.Agent.ListNodes, &tetherv1.ListNodesRequest{RootNodeId: d.Root, OneLevel: true, PageToken: after, PageSize: treeBudget})
	if !ok {
		return
	}
	calls, budget := 1, treeBudget-len(resp.Msg.Nodes)
	level := treeLevel(resp.Msg)
	d.Roots = level
	if rootNode != nil {
		// The named node on top, its page of children below.
		count, known := resp.Msg.ChildCounts[d.Root]
		d.Roots = []*treeNode{{Node: rootNode, Children: level, ChildCount: count, HasCount: known, Open: true}}
	}
	if resp.Msg.NextPageToken != "" {
		d.Next = link(d.Root, resp.Msg.NextPageToken)
	}
	for len(level) > 0 {
		var next []*treeNode
		for _, t := range level {
			if t.HasCount && t.ChildCount == 0 {
				continue
			}
			if budget <= 0 || calls >= treeCalls {
				t.Unread = true
				continue
			}
			sub, err := s.clients.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: t.Node.NodeId, OneLevel: true, PageSize: int32(budget)}))
			calls++
			if err != nil {
				c.apiFail(w, r, s, "Could not list the children of "+t.Node.NodeId, err)
				return
			}
			t.Children = treeLevel(sub.Msg)
			t.Open = true
			budget -= len(t.Children)
			if sub.Msg.NextPageToken != "" {
				t.More = link(t.Node.NodeId, sub.Msg.NextPageToken)
			}
			next = append(next, t.Children...)
		}
		level = next
	}
	var count func(ts []*treeNode)
	count = func(ts []*treeNode) {
		for _, t := range ts {
			d.Total++
			d.Counts[nodeState(t.Node.State)]++
			count(t.Children)
		}
	}
	count(d.Roots)
	c.render(w, r, s, http.StatusOK, "tree", "Agent tree", d)
}

// treeLevel is a one_level answer's nodes, sorted by name, with their
// child counts.
func treeLevel(m *tetherv1.ListNodesResponse) []*treeNode {
	out := make([]*treeNode, len(m.Nodes))
	for i, n := range m.Nodes {
		c, ok := m.ChildCounts[n.NodeId]
		out[i] = &treeNode{Node: n, ChildCount: c, HasCount: ok}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node.Name != out[j].Node.Name {
			return out[i].Node.Name < out[j].Node.Name
		}
		return out[i].Node.NodeId < out[j].Node.NodeId
	})
	return out
}

// filteredTree shows a page of the nodes the label selector (applied by
// the server) and the state filter match, within ?root= when given: it
// reads pages of ListNodes until it has filterPage matches or has made
// filterCalls listings, and links the next page. Within ?root= it reads
// that subtree's pages (subtree_pages), not the whole tree's listing: a
// rogue's nodes elsewhere in the tree are not read for it.
func (c *Console) filteredTree(ctx context.Context, w http.ResponseWriter, r *http.Request, s *session, d *treeData, token string) {
	d.Filtered = true
	for calls := 0; calls < filterCalls; calls++ {
		resp, ok := apiCall(ctx, c, w, r, s, "Could not list the agent tree", s.clients.Agent.ListNodes, &tetherv1.ListNodesRequest{RootNodeId: d.Root, LabelSelector: d.Selector, PageToken: token, PageSize: filterPage, SubtreePages: d.Root != ""})
		if !ok {
			return
		}
		for _, n := range resp.Msg.Nodes {
			if d.Root != "" && n.NodeId != d.Root && !slices.Contains(n.Ancestors, d.Root) {
				// The server lists the subtree only; kept should it not.
				continue
			}
			d.Total++
			d.Counts[nodeState(n.State)]++
			if d.State == "" || nodeState(n.State) == d.State {
				d.Matches = append(d.Matches, n)
			}
		}
		token = resp.Msg.NextPageToken
		if token == "" || len(d.Matches) >= filterPage {
			break
		}
	}
	d.Paths = agentsdk.AncestorPaths(ctx, s.clients.Agent, d.Matches, maxPathReads)
	if token != "" {
		v := url.Values{"after": {token}}
		for k, x := range map[string]string{"selector": d.Selector, "state": d.State, "root": d.Root} {
			if x != "" {
				v.Set(k, x)
			}
		}
		d.Next = "/ui/tree?" + v.Encode()
	}
	c.render(w, r, s, http.StatusOK, "tree", "Agent tree", *d)
}

// maxPathReads bounds the nodes the filtered view reads to name the
// ancestors of its matches that the page does not hold; past it an
// ancestor is named by its id.
const maxPathReads = 100

// ---- a node ----

// pathEntry is an ancestor on a node's page: its id, and its name when it
// could be read.
type pathEntry struct{ ID, Name string }

type nodeData struct {
	Node     *tetherv1.Node
	State    string
	Children []*tetherv1.Node
	// ChildCount: its number of children, as the tree stores it (HasCount
	// false: not stored); MoreChildren links to the children after the
	// first page.
	ChildCount   uint64
	HasCount     bool
	MoreChildren string
	Grants       []*tetherv1.Grant
	Leases       []*tetherv1.Lease
	Proposals    []*tetherv1.StopProposal
	Calls        []*tetherv1.ToolCall
	Privileges   []*tetherv1.Privilege
	Errors       []string
	// Path: its ancestors, root first, by name (an ancestor that could
	// not be read by its id alone), so that a node named like another
	// (a rogue's child "worker-2") reads as where it is.
	Path []pathEntry
	// MoreGrants, MoreLeases, MoreProposals: the node holds more than the
	// first answer (a thousand) shows; MoreLeases links to the rest.
	MoreGrants    bool
	MoreLeases    string
	MoreProposals bool
}

func (c *Console) node(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id := r.PathValue("id")
	got, ok := apiCall(ctx, c, w, r, s, "Could not read node "+linked(id), s.clients.Agent.GetNode, &tetherv1.GetNodeRequest{NodeId: id})
	if !ok {
		return
	}
	if err := answered("node", id, got.Msg.Node.GetNodeId(), got.Msg.Node != nil); err != nil {
		c.apiFail(w, r, s, "Could not read node "+linked(id), err)
		return
	}
	d := nodeData{Node: got.Msg.Node, State: nodeState(got.Msg.Node.State)}
	// Its ancestors by name (a read each; the tree is at most 32 deep):
	// the page of a rogue's child named "worker-2" named only its parent's
	// id, and read like the real worker-2's.
	for _, a := range got.Msg.Node.Ancestors {
		e := pathEntry{ID: a}
		if an, err := s.clients.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: a})); err == nil && an.Msg.Node.GetNodeId() == a {
			e.Name = an.Msg.Node.Name
		}
		d.Path = append(d.Path, e)
	}
	// The sections below are read one by one; a section the caller may not
	// read shows the server's refusal instead of failing the page.
	section := func(name string, err error) bool {
		if err != nil {
			d.Errors = append(d.Errors, name+": "+errorText(err))
		}
		return err == nil
	}
	// A page of its children (one level, never its subtree: a rogue may
	// grow its own to a hundred thousand) and their number, as the tree
	// stores it; the rest are on the tree page's pages.
	if sub, err := s.clients.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{RootNodeId: id, OneLevel: true, PageSize: nodeChildren})); section("children", err) {
		d.Children = sub.Msg.Nodes
		d.ChildCount, d.HasCount = sub.Msg.ChildCounts[id]
		if sub.Msg.NextPageToken != "" {
			d.MoreChildren = "/ui/tree?" + url.Values{"root": {id}, "after": {sub.Msg.NextPageToken}}.Encode()
		}
	}
	if g, err := s.clients.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: id})); section("grants", err) {
		d.Grants, d.MoreGrants = g.Msg.Grants, g.Msg.NextPageToken != ""
	}
	if l, err := s.clients.Lease.ListLeases(ctx, connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: id})); section("leases", err) {
		d.Leases = l.Msg.Leases
		if l.Msg.NextPageToken != "" {
			// Whoever offers the node jobs chooses their ids, and so which
			// come first: the rest are a page away, never out of sight.
			d.MoreLeases = "/ui/leases?" + url.Values{"holder": {id}, "page": {l.Msg.NextPageToken}}.Encode()
		}
	}
	// Its pending proposals (a few: the agent's own are bounded, and its
	// rules') whatever page they would fall on, to be decided here; then
	// the first page of every one, decided ones never pruned.
	if p, err := s.clients.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: id, State: tetherv1.ProposalState_PROPOSAL_STATE_PENDING})); section("stop proposals", err) {
		d.Proposals = p.Msg.Proposals
		if all, err := s.clients.Supervisor.ListProposals(ctx, connect.NewRequest(&tetherv1.ListProposalsRequest{NodeId: id})); section("stop proposals", err) {
			for _, q := range all.Msg.Proposals {
				if q.State != tetherv1.ProposalState_PROPOSAL_STATE_PENDING {
					d.Proposals = append(d.Proposals, q)
				}
			}
			d.MoreProposals = all.Msg.NextPageToken != ""
		}
	}
	if calls, err := s.clients.Tool.ListCalls(ctx, connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: id})); section("tool calls", err) {
		d.Calls = calls.Msg.Calls
	}
	if privs, err := s.clients.Supervisor.ListPrivileges(ctx, connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: id})); section("privileges", err) {
		d.Privileges = privs.Msg.Privileges
	}
	c.render(w, r, s, http.StatusOK, "node", d.Node.Name+" ("+id+")", d)
}

// formDuration parses an optional duration field.
func formDuration(r *http.Request, field string) (*durationpb.Duration, error) {
	v := strings.TrimSpace(r.PostForm.Get(field))
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, fmt.Errorf("%s %q is not a duration such as 30s or 2m", strings.ReplaceAll(field, "_", " "), v)
	}
	return durationpb.New(d), nil
}

func (c *Console) terminate(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id := r.PathValue("id")
	req := &tetherv1.TerminateRequest{NodeId: id, Reason: strings.TrimSpace(r.PostForm.Get("reason"))}
	switch r.PostForm.Get("mode") {
	case "drain":
		req.Mode = tetherv1.TerminationMode_TERMINATION_MODE_DRAIN
	case "abort":
		req.Mode = tetherv1.TerminationMode_TERMINATION_MODE_ABORT
	default:
		c.fail(w, r, s, http.StatusBadRequest, "refused: no mode", "Choose drain or abort. Nothing was done.")
		return
	}
	var err error
	if req.DrainWindow, err = formDuration(r, "drain_window"); err == nil {
		req.ConfirmTimeout, err = formDuration(r, "confirm_timeout")
	}
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, "refused: bad duration", err.Error()+". Nothing was done.")
		return
	}
	expected := r.PostForm.Get("expected_state")
	got, ok := apiCall(ctx, c, w, r, s, "Could not read node "+linked(id), s.clients.Agent.GetNode, &tetherv1.GetNodeRequest{NodeId: id})
	if !ok {
		return
	}
	if err := answered("node", id, got.Msg.Node.GetNodeId(), got.Msg.Node != nil); err != nil {
		c.apiFail(w, r, s, "Could not read node "+linked(id), err)
		return
	}
	if now := nodeState(got.Msg.Node.State); expected == "" || now != expected {
		c.stale(w, r, s, "Node "+linked(id), orUnknown(expected), now)
		return
	}
	resp, err := s.clients.Supervisor.Terminate(ctx, connect.NewRequest(req))
	if err != nil {
		c.apiFail(w, r, s, "The server refused to terminate "+linked(id), err)
		return
	}
	if resp.Msg.Termination.GetTerminationId() == "" {
		// The stop was asked for; its answer does not say of which
		// termination. The node's page shows it.
		c.apiFail(w, r, s, "The stop of "+linked(id)+" was sent, and its answer names no termination", answered("termination", "", "", false))
		return
	}
	http.Redirect(w, r, "/ui/terminations/"+url.PathEscape(resp.Msg.Termination.TerminationId), http.StatusSeeOther)
}

func orUnknown(s string) string {
	if s == "" {
		return "no state"
	}
	return s
}

// ---- terminations ----

func (c *Console) termination(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	resp, ok := pageCall(c, w, r, s, "Could not read termination "+linked(id), s.clients.Supervisor.GetTermination, &tetherv1.GetTerminationRequest{TerminationId: id})
	if !ok {
		return
	}
	if err := answered("termination", id, resp.Msg.Termination.GetTerminationId(), resp.Msg.Termination != nil); err != nil {
		c.apiFail(w, r, s, "Could not read termination "+linked(id), err)
		return
	}
	c.render(w, r, s, http.StatusOK, "termination", "Termination "+id, terminationView(resp.Msg.Termination))
}

// terminationJSON is what the page shows and the event stream sends.
type terminationJSON struct {
	ID            string `json:"id"`
	NodeID        string `json:"node_id"`
	State         string `json:"state"`
	Mode          string `json:"mode"`
	Escalated     bool   `json:"escalated"`
	RecordID      string `json:"record_id"`
	RequestedBy   string `json:"requested_by"`
	Reason        string `json:"reason"`
	RequestedAt   string `json:"requested_at"`
	UpdatedAt     string `json:"updated_at"`
	DrainWindow   string `json:"drain_window"`
	NodesTotal    uint32 `json:"nodes_total"`
	NodesMarked   uint32 `json:"nodes_marked"`
	CallsInFlight uint32 `json:"calls_in_flight"`
	AcksPending   uint32 `json:"acks_pending"`
	Confirmations uint32 `json:"confirmations"`
	Phases        []string
}

var terminationPhases = []string{"requested", "draining", "aborting", "reconciling", "terminated"}

func terminationView(t *tetherv1.Termination) terminationJSON {
	p := t.GetProgress()
	v := terminationJSON{
		ID: t.TerminationId, NodeID: t.NodeId, State: termState(t.State),
		Mode: enumName(t.Mode.String(), "TERMINATION_MODE_"), Escalated: t.Escalated, RecordID: t.RecordId,
		RequestedBy: t.RequestedBy, Reason: t.Reason, RequestedAt: ts(t.RequestedAt), UpdatedAt: ts(t.UpdatedAt),
		DrainWindow: dur(t.DrainWindow),
		NodesTotal:  p.GetNodesTotal(), NodesMarked: p.GetNodesMarked(), CallsInFlight: p.GetCallsInFlight(),
		AcksPending: p.GetAcksPending(), Confirmations: p.GetConfirmations(), Phases: terminationPhases,
	}
	if t.Mode == tetherv1.TerminationMode_TERMINATION_MODE_ABORT {
		// An abort never drains.
		v.DrainWindow = "— (abort)"
		v.Phases = []string{"requested", "aborting", "reconciling", "terminated"}
	}
	return v
}

// events starts a server-sent event stream.
func events(w http.ResponseWriter) sendEvent {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	return func(event string, v any) error {
		b, err := visibleJSON(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		return rc.Flush()
	}
}

// sendEvent sends one server-sent event: its name and its JSON data.
type sendEvent = func(event string, v any) error

// relayEvents relays a server stream, opened with err, as server-sent
// events: each sends a message's events and says whether the stream goes
// on; the server's error ends it as a "failed" event. A stream that did not
// open is an error page that says what could not be watched.
func relayEvents[M any](c *Console, w http.ResponseWriter, r *http.Request, s *session, what string, stream *connect.ServerStreamForClient[M], err error, each func(send sendEvent, m *M) (more bool)) {
	if err != nil {
		c.apiFail(w, r, s, what, err)
		return
	}
	defer stream.Close()
	send := events(w)
	for stream.Receive() {
		// The session is checked before each event: one that ended
		// (signed out, evicted, expired on the console's clock) reads
		// nothing more, on no tab it left open.
		if !c.live(s) {
			break
		}
		if !each(send, stream.Msg()) {
			return
		}
	}
	if !c.live(s) {
		_ = send("failed", map[string]string{"error": "your session has ended; sign in again"})
		return
	}
	if err := stream.Err(); err != nil && connect.CodeOf(err) != connect.CodeCanceled {
		_ = send("failed", map[string]string{"error": errorText(err)})
	}
}

// streamContext is the context of a live page's stream: it ends with the
// request or with the session, whichever ends first, so that a session's
// end closes the streams its tabs hold open (a stream is authenticated
// once, when it opens).
func streamContext(r *http.Request, s *session) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(s.ended, cancel)
	return ctx, func() { stop(); cancel() }
}

func (c *Console) terminationEvents(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, cancel := streamContext(r, s)
	defer cancel()
	stream, err := s.clients.Supervisor.WatchTermination(ctx, connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: id}))
	relayEvents(c, w, r, s, "Could not watch termination "+linked(id), stream, err, func(send sendEvent, m *tetherv1.WatchTerminationResponse) bool {
		t := m.Termination
		if err := answered("termination", id, t.GetTerminationId(), t != nil); err != nil {
			_ = send("failed", map[string]string{"error": errorText(err)})
			return false
		}
		if send("termination", terminationView(t)) != nil {
			return false
		}
		if t.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED && t.RecordId != "" {
			_ = send("end", map[string]string{})
			return false
		}
		return true
	})
}

// ---- records ----

type recordSummary struct {
	Record      *tetherv1.ReconciliationRecord
	Unaccounted int
	Confirmed   int
	// Superseded: the nodes another termination accounts for (it took
	// them over, or had them first); they did not confirm their exit in
	// this one, and its record is not where their end is told.
	Superseded     int
	UnresolvedCall int
	FailedRevokes  int
	// RanOn: the calls that ran on after their cancel (agentsdk.RanOnAfterCancel).
	RanOn      int
	Unresolved int
	// Partial: the list carried only the record's first entries (a record
	// too large to list whole); the counts are theirs.
	Partial bool
}

func summarize(rec *tetherv1.ReconciliationRecord) recordSummary {
	sum := recordSummary{Record: rec}
	for _, n := range rec.Nodes {
		switch n.Outcome {
		case tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED:
			sum.Unaccounted++
		case tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED:
			// Left to another termination: not confirmed here. An agent
			// that drains its own subtree on a day's window and is then
			// aborted by an operator has its stop's record list every
			// node superseded, and the page said each confirmed its exit.
			sum.Superseded++
		default:
			sum.Confirmed++
		}
	}
	for _, call := range rec.ToolCalls {
		if unresolvedCall(call.Resolution) {
			sum.UnresolvedCall++
		}
		if agentsdk.RanOnAfterCancel(call) {
			sum.RanOn++
		}
	}
	for _, p := range rec.Privileges {
		if p.Outcome == tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED {
			sum.FailedRevokes++
		}
	}
	for _, l := range rec.Leases {
		if l.Outcome == tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED {
			sum.Unresolved++
		}
	}
	return sum
}

// unresolvedCall: a call whose end nobody vouched for.
func unresolvedCall(r tetherv1.CallResolution) bool {
	return r == tetherv1.CallResolution_CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED || r == tetherv1.CallResolution_CALL_RESOLUTION_UNSPECIFIED
}

type recordsData struct {
	Records []recordSummary
	Next    string // the link to the next page, filters kept
	Tree    string // the filter's tree (a node id of it), as asked
	By      string // the filter's requester: operator, agent, rollout or ""
}

// recordRequesters are the records page's requester filter's values.
var recordRequesters = map[string]tetherv1.RecordRequester{
	"":         tetherv1.RecordRequester_RECORD_REQUESTER_UNSPECIFIED,
	"operator": tetherv1.RecordRequester_RECORD_REQUESTER_OPERATOR,
	"agent":    tetherv1.RecordRequester_RECORD_REQUESTER_AGENT,
	"rollout":  tetherv1.RecordRequester_RECORD_REQUESTER_ROLLOUT,
}

// records lists records fifty at a time, of one tree and one kind of
// requester when asked (tree=<node id>, by=operator|agent|rollout): an
// agent that stops its own children writes a record each time, and
// without a filter they push an operator's records to later pages.
func (c *Console) records(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := recordsData{Tree: strings.TrimSpace(q.Get("tree")), By: q.Get("by")}
	by, known := recordRequesters[d.By]
	if !known {
		c.fail(w, r, s, http.StatusBadRequest, "refused: unknown requester", "The records page filters by requester operator, agent or rollout, not "+strconv.Quote(d.By)+".")
		return
	}
	resp, ok := pageCall(c, w, r, s, "Could not list records", s.clients.Supervisor.ListRecords, &tetherv1.ListRecordsRequest{
		PageSize: 50, PageToken: q.Get("page"), TreeNodeId: d.Tree, RequestedBy: by,
	})
	if !ok {
		return
	}
	if next := resp.Msg.NextPageToken; next != "" {
		nq := url.Values{"page": {next}}
		if d.Tree != "" {
			nq.Set("tree", d.Tree)
		}
		if d.By != "" {
			nq.Set("by", d.By)
		}
		d.Next = "/ui/records?" + nq.Encode()
	}
	for _, rec := range resp.Msg.Records {
		sum := summarize(rec)
		sum.Partial = slices.Contains(resp.Msg.PartialRecordIds, rec.RecordId)
		d.Records = append(d.Records, sum)
	}
	c.render(w, r, s, http.StatusOK, "records", "Reconciliation records", d)
}

// RecordRows is how many rows each list of a record page draws (a
// variable for tests). A record lists every node of the stopped subtree,
// and a rogue may grow its own to a hundred thousand, none confirming its
// exit: the page drew a row for each, in its Agents table and again in
// Needs attention, megabytes for the operator who came to read their own
// stop's outcome. The rest are counted, and listed whole in the JSON and
// by `tether record show`.
var RecordRows = 500

// recordReads is how many GetRecord answers (each up to a few MiB of
// entries) a record page reads. The page read every answer to count the
// record, into memory in the control plane's own process, on every load:
// a rogue's subtree of a hundred thousand nodes, each with what it held
// and its contradictions, made each operator's look at the stop's outcome
// cost the whole record. A record past it is counted and drawn from the
// entries read (Partial), and says so; its JSON and `tether record show`
// read it whole.
const recordReads = 4

type recordData struct {
	recordSummary
	// Read: the entries (nodes, calls, privileges, leases) the page read;
	// fewer than the record's when Partial.
	Read             int
	UnaccountedNodes []*tetherv1.RecordNode
	UnresolvedCalls  []*tetherv1.RecordToolCall
	// RanOn: the calls whose end a gate reported (completed or failed)
	// after the termination ordered their cancel: resolved, but the tool
	// was not stopped by the order, and did what it did after it.
	RanOn            []*tetherv1.RecordToolCall
	FailedPrivileges []*tetherv1.RecordPrivilege
	UnresolvedLeases []*tetherv1.RecordLease
	// What the page draws of the record's lists, RecordRows of each, and
	// how many of each it leaves out (More*).
	Nodes      []*tetherv1.RecordNode
	ToolCalls  []*tetherv1.RecordToolCall
	Privileges []*tetherv1.RecordPrivilege
	Leases     []*tetherv1.RecordLease
	// LeftTo: the terminations the record's superseded nodes were left
	// to, once each, RecordRows at most (MoreLeftTo more).
	LeftTo     []string
	MoreLeftTo int
	// Refused: the nodes with refused calls counted and not listed.
	Refused                                                                []*tetherv1.RecordNode
	MoreUnaccounted, MoreUnresolvedCalls, MoreFailed, MoreUnresolvedLeases int
	MoreRanOn                                                              int
	MoreNodes, MoreToolCalls, MorePrivileges, MoreLeases, MoreRefused      int
}

// firstRows is s cut to RecordRows, and how many it left out.
func firstRows[T any](s []T) ([]T, int) {
	if len(s) <= RecordRows {
		return s, 0
	}
	return s[:RecordRows], len(s) - RecordRows
}

func (c *Console) record(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	// A large record arrives in pages: the page reads recordReads of them
	// and counts those.
	ctx, cancel := pageContext(r)
	defer cancel()
	rec, partial, err := agentsdk.ReadRecordPages(ctx, s.clients.Supervisor, &tetherv1.GetRecordRequest{RecordId: id}, recordReads)
	if err != nil {
		c.apiFail(w, r, s, "Could not read record "+linked(id), err)
		return
	}
	d := recordData{recordSummary: summarize(rec)}
	d.Partial = partial
	d.Read = len(rec.Nodes) + len(rec.ToolCalls) + len(rec.Privileges) + len(rec.Leases)
	for _, n := range rec.Nodes {
		if n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED {
			d.UnaccountedNodes = append(d.UnaccountedNodes, n)
		}
	}
	for _, call := range rec.ToolCalls {
		if unresolvedCall(call.Resolution) {
			d.UnresolvedCalls = append(d.UnresolvedCalls, call)
		}
		if agentsdk.RanOnAfterCancel(call) {
			d.RanOn = append(d.RanOn, call)
		}
	}
	for _, p := range rec.Privileges {
		if p.Outcome == tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKE_FAILED {
			d.FailedPrivileges = append(d.FailedPrivileges, p)
		}
	}
	for _, l := range rec.Leases {
		if l.Outcome == tetherv1.LeaseOutcome_LEASE_OUTCOME_UNRESOLVED {
			d.UnresolvedLeases = append(d.UnresolvedLeases, l)
		}
	}
	seen := map[string]bool{}
	for _, n := range rec.Nodes {
		if by := n.SupersededByTerminationId; n.Outcome == tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED && by != "" && !seen[by] {
			seen[by] = true
			d.LeftTo = append(d.LeftTo, by)
		}
	}
	for _, n := range rec.Nodes {
		if n.RefusedCallsNotListed > 0 {
			d.Refused = append(d.Refused, n)
		}
	}
	// The counts above are of the whole record; the page draws a page of
	// each list.
	d.UnaccountedNodes, d.MoreUnaccounted = firstRows(d.UnaccountedNodes)
	d.UnresolvedCalls, d.MoreUnresolvedCalls = firstRows(d.UnresolvedCalls)
	d.RanOn, d.MoreRanOn = firstRows(d.RanOn)
	d.FailedPrivileges, d.MoreFailed = firstRows(d.FailedPrivileges)
	d.UnresolvedLeases, d.MoreUnresolvedLeases = firstRows(d.UnresolvedLeases)
	d.Nodes, d.MoreNodes = firstRows(rec.Nodes)
	d.ToolCalls, d.MoreToolCalls = firstRows(rec.ToolCalls)
	d.Privileges, d.MorePrivileges = firstRows(rec.Privileges)
	d.Leases, d.MoreLeases = firstRows(rec.Leases)
	d.Refused, d.MoreRefused = firstRows(d.Refused)
	d.LeftTo, d.MoreLeftTo = firstRows(d.LeftTo)
	c.render(w, r, s, http.StatusOK, "record", "Record "+id, d)
}

// recordJSON downloads the record exactly as the record sinks publish it
// (docs/record.schema.json).
func (c *Console) recordJSON(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, cancel := pageContext(r)
	defer cancel()
	rec, err := agentsdk.ReadRecord(ctx, s.clients.Supervisor, &tetherv1.GetRecordRequest{RecordId: id})
	if err != nil {
		c.apiFail(w, r, s, "Could not read record "+linked(id), err)
		return
	}
	b, err := wire.RecordJSON(rec)
	if err != nil {
		c.fail(w, r, s, http.StatusInternalServerError, "Could not render the record", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", attachment("record-"+rec.RecordId+".json"))
	_, _ = w.Write(b)
}

// attachment is a Content-Disposition naming a download; ids are plain
// ASCII, anything else is replaced.
func attachment(name string) string {
	safe := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, name)
	return `attachment; filename="` + safe + `"`
}

// ---- leases and the evidence matrix ----

type leasesData struct {
	Holder string
	Leases []*tetherv1.Lease
	Next   string
}

func (c *Console) leases(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	resp, ok := pageCall(c, w, r, s, "Could not list leases", s.clients.Lease.ListLeases, &tetherv1.ListLeasesRequest{HolderIdentity: q.Get("holder"), PageSize: 200, PageToken: q.Get("page")})
	if !ok {
		return
	}
	c.render(w, r, s, http.StatusOK, "leases", "Job leases", leasesData{Holder: q.Get("holder"), Leases: resp.Msg.Leases, Next: resp.Msg.NextPageToken})
}

// evidenceFilter narrows the matrix's rows.
type evidenceFilter struct {
	Outcome    string // accepted, duplicate, rejected
	Message    string // offer, ack, renew, ...
	Generation string
	Flag       string // stale, late, expired, conflict, cancel
}

func (f evidenceFilter) match(r *tetherv1.EvidenceRow) bool {
	if f.Outcome != "" && enumName(r.Decision.GetOutcome().String(), "OUTCOME_") != f.Outcome {
		return false
	}
	if f.Message != "" && r.Message != f.Message {
		return false
	}
	if f.Generation != "" && strconv.FormatUint(r.Generation, 10) != f.Generation {
		return false
	}
	switch f.Flag {
	case "stale":
		return r.StaleGeneration
	case "late":
		return r.LateProgress
	case "expired":
		return r.LeaseExpired
	case "conflict":
		return r.OwnershipConflict
	case "cancel":
		return r.CancelRequested
	}
	return true
}

func (f evidenceFilter) query() string {
	v := url.Values{}
	for k, s := range map[string]string{"outcome": f.Outcome, "message": f.Message, "generation": f.Generation, "flag": f.Flag} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

type evidenceRowView struct {
	Row     uint64
	Cells   []string
	Outcome string
	Flagged bool
}

type evidenceData struct {
	Job    string
	Header []string
	Rows   []evidenceRowView
	// Total counts the rows read after row After, Matched those the
	// filter keeps; Rows are the first of them, at most maxEvidenceShown.
	// Partial: the page stopped reading before the matrix's end.
	Total    int
	Matched  int
	Partial  bool
	After    uint64
	Next     string // the link to the rows after the last one shown
	Filter   evidenceFilter
	CSV      string
	Messages []string
	// Stale is what each former holder sent about the job after it
	// stopped holding it: its first messages are rows (kept), the later
	// ones that changed nothing were only counted (folded).
	Stale []staleCountView
}

type staleCountView struct {
	Holder       string
	Kept, Folded uint64
}

// maxEvidenceShown bounds the rows one evidence page shows (and holds in
// memory); the rest are a "next" link, a narrower filter or the CSV away.
const maxEvidenceShown = 1000

// evidenceReads bounds the Evidence answers (a thousand rows each) one
// evidence page reads. The holder of a live generation adds a row with
// every renewal and progress report, kept for ever: a page that read the
// whole matrix to count it cost the operator a read per thousand of the
// rogue's messages, and past its deadline never drew at all. The page
// reads on from where the one before stopped (its "next" link).
const evidenceReads = 4

// errEnoughEvidence stops the reading once a page has all it shows.
var errEnoughEvidence = errors.New("the page has its rows")

// evidencePages reads a job's evidence matrix page by page from token,
// at most reads pages (0: every page), and hands each to each with the
// token it was read with: the server answers at most 1000 rows at a time,
// and a job's holder writes as many rows as it sends messages, so a
// console that read the first answer only would show a rogue's first
// thousand messages and none of what it did after them. rest is the
// token of the first page left unread ("" when the matrix ended, or each
// returned errEnoughEvidence). The first page's failure is rendered
// (nothing was written yet); a later one is returned.
//
// stale, when not nil, is set to the former holders' counts of their late
// messages, which every page carries (the last page's).
func (c *Console) evidencePages(w http.ResponseWriter, r *http.Request, s *session, job, token string, reads int, stale *[]*tetherv1.StaleCount, each func(page []*tetherv1.EvidenceRow, token string) error) (ok bool, rest string, err error) {
	ctx, cancel := pageContext(r)
	defer cancel()
	for read := 0; ; read++ {
		if reads > 0 && read == reads {
			return true, token, nil
		}
		resp, err := s.clients.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: job, PageToken: token}))
		if err != nil {
			if read == 0 {
				c.apiFail(w, r, s, "Could not read the evidence of job "+linked(job), err)
				return false, "", nil
			}
			return true, "", err
		}
		if stale != nil {
			*stale = resp.Msg.StaleCounts
		}
		if err := each(resp.Msg.Rows, token); err != nil {
			if errors.Is(err, errEnoughEvidence) {
				return true, "", nil
			}
			return true, "", err
		}
		next := resp.Msg.NextPageToken
		if next == "" {
			return true, "", nil
		}
		if next == token {
			return true, "", fmt.Errorf("the server answered evidence page token %q twice", next)
		}
		token = next
	}
}

func evidenceFilterOf(r *http.Request) evidenceFilter {
	q := r.URL.Query()
	return evidenceFilter{Outcome: q.Get("outcome"), Message: q.Get("message"), Generation: q.Get("generation"), Flag: q.Get("flag")}
}

func (c *Console) evidence(w http.ResponseWriter, r *http.Request, s *session) {
	job := r.PathValue("job")
	f := evidenceFilterOf(r)
	d := evidenceData{Job: job, Header: seedHeader(), Filter: f, CSV: "/ui/jobs/" + url.PathEscape(job) + "/evidence/csv" + f.query(),
		Messages: []string{"offer", "ack", "renew", "progress", "cancel", "cancel_ack", "complete", "reassign", "resolve", "expire", "ack_deadline", "recover"}}
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			c.fail(w, r, s, http.StatusBadRequest, "refused: bad row number", fmt.Sprintf("after %q is not a row number.", a))
			return
		}
		d.After = n
	}
	start := r.URL.Query().Get("page")
	more, moreFrom := false, ""
	var stale []*tetherv1.StaleCount
	ok, rest, err := c.evidencePages(w, r, s, job, start, evidenceReads, &stale, func(page []*tetherv1.EvidenceRow, token string) error {
		for _, row := range page {
			if row.Row <= d.After {
				continue
			}
			d.Total++
			if !f.match(row) {
				continue
			}
			if len(d.Rows) == maxEvidenceShown {
				// The next page starts at this page, after the last
				// row shown.
				more, moreFrom = true, token
				return errEnoughEvidence
			}
			d.Matched++
			cells := wire.EvidenceRowFromProto(row).SeedRecord()
			cells[0] = printable.JobID(cells[0]) // the Job ID column
			d.Rows = append(d.Rows, evidenceRowView{
				Row: row.Row, Cells: cells,
				Outcome: enumName(row.Decision.GetOutcome().String(), "OUTCOME_"),
				Flagged: row.StaleGeneration || row.LateProgress || row.LeaseExpired || row.OwnershipConflict,
			})
		}
		return nil
	})
	if !ok {
		return
	}
	if err != nil {
		c.apiFail(w, r, s, "Could not read the whole evidence of job "+linked(job), err)
		return
	}
	if more || rest != "" {
		// The rows read so far are counted; the rest are a link away,
		// read from where this page stopped.
		d.Partial = true
		q := url.Values{}
		for k, v := range r.URL.Query() {
			q[k] = v
		}
		if more {
			q.Set("after", strconv.FormatUint(d.Rows[len(d.Rows)-1].Row, 10))
			q.Set("page", moreFrom)
		} else {
			q.Set("page", rest)
		}
		if moreFrom == "" && more {
			q.Del("page")
		}
		d.Next = "/ui/jobs/" + url.PathEscape(job) + "/evidence?" + q.Encode()
	}
	for _, sc := range stale {
		d.Stale = append(d.Stale, staleCountView{Holder: sc.HolderIdentity, Kept: sc.Kept, Folded: sc.Folded})
	}
	c.render(w, r, s, http.StatusOK, "evidence", "Evidence matrix of job "+printable.JobID(job), d)
}

// evidenceCSV streams every row the filter keeps, page by page. A page
// that cannot be read once the download began aborts it (the browser
// reports a failed download), rather than ending it as if the matrix
// ended there.
func (c *Console) evidenceCSV(w http.ResponseWriter, r *http.Request, s *session) {
	job := r.PathValue("job")
	f := evidenceFilterOf(r)
	var cw *csv.Writer
	ok, _, err := c.evidencePages(w, r, s, job, "", 0, nil, func(page []*tetherv1.EvidenceRow, _ string) error {
		if cw == nil {
			w.Header().Set("Content-Type", "text/csv; charset=utf-8")
			w.Header().Set("Content-Disposition", attachment("evidence-"+job+".csv"))
			cw = csv.NewWriter(w)
			_ = cw.Write(seedHeader())
		}
		for _, row := range page {
			if f.match(row) {
				_ = cw.Write(wire.EvidenceRowFromProto(row).SeedRecord())
			}
		}
		cw.Flush()
		return cw.Error()
	})
	if !ok {
		return
	}
	if err != nil {
		c.cfg.Log.Warn("console: evidence download cut short", "job", job, "error", err)
		panic(http.ErrAbortHandler)
	}
}

// ---- grants ----

type grantData struct {
	Grant   *tetherv1.Grant
	State   string
	Derived []*tetherv1.Grant
	More    bool
	Revoked string
}

func (c *Console) loadGrant(w http.ResponseWriter, r *http.Request, s *session) (grantData, bool) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id := r.PathValue("id")
	g, ok := apiCall(ctx, c, w, r, s, "Could not read grant "+linked(id), s.clients.Capability.GetGrant, &tetherv1.GetGrantRequest{GrantId: id})
	if !ok {
		return grantData{}, false
	}
	if err := answered("grant", id, g.Msg.Grant.GetGrantId(), g.Msg.Grant != nil); err != nil {
		c.apiFail(w, r, s, "Could not read grant "+linked(id), err)
		return grantData{}, false
	}
	d := grantData{Grant: g.Msg.Grant, State: grantState(g.Msg.Grant.State)}
	// "revoked" is where revoke sends the operator, with the tombstone's
	// sequence; but anyone can hand an operator a link with it, so the
	// notice shows only for a grant the server says is revoked.
	if seq, err := strconv.ParseUint(r.URL.Query().Get("revoked"), 10, 64); err == nil && d.State == "revoked" {
		d.Revoked = strconv.FormatUint(seq, 10)
	}
	sub, ok := apiCall(ctx, c, w, r, s, "Could not list the grants derived from "+linked(id), s.clients.Capability.ListGrants, &tetherv1.ListGrantsRequest{DerivedFromGrantId: id, PageSize: 200})
	if !ok {
		return grantData{}, false
	}
	for _, x := range sub.Msg.Grants {
		if x.GrantId != id {
			d.Derived = append(d.Derived, x)
		}
	}
	d.More = sub.Msg.NextPageToken != ""
	return d, true
}

func (c *Console) grant(w http.ResponseWriter, r *http.Request, s *session) {
	if d, ok := c.loadGrant(w, r, s); ok {
		c.render(w, r, s, http.StatusOK, "grant", "Grant "+d.Grant.GrantId, d)
	}
}

func (c *Console) revokeConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	if d, ok := c.loadGrant(w, r, s); ok {
		c.render(w, r, s, http.StatusOK, "revoke", "Revoke grant "+d.Grant.GrantId+"?", d)
	}
}

func (c *Console) revoke(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id := r.PathValue("id")
	if r.PostForm.Get("confirm") != "yes" {
		c.fail(w, r, s, http.StatusBadRequest, "refused: not confirmed", "Revoking a grant needs the confirmation step. Nothing was revoked.")
		return
	}
	g, ok := apiCall(ctx, c, w, r, s, "Could not read grant "+linked(id), s.clients.Capability.GetGrant, &tetherv1.GetGrantRequest{GrantId: id})
	if !ok {
		return
	}
	if err := answered("grant", id, g.Msg.Grant.GetGrantId(), g.Msg.Grant != nil); err != nil {
		c.apiFail(w, r, s, "Could not read grant "+linked(id), err)
		return
	}
	if now, expected := grantState(g.Msg.Grant.State), r.PostForm.Get("expected_state"); expected == "" || now != expected {
		c.stale(w, r, s, "Grant "+linked(id), orUnknown(expected), now)
		return
	}
	resp, ok := apiCall(ctx, c, w, r, s, "The server refused to revoke "+linked(id), s.clients.Capability.Revoke, &tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: id}, Reason: strings.TrimSpace(r.PostForm.Get("reason"))})
	if !ok {
		return
	}
	http.Redirect(w, r, "/ui/grants/"+url.PathEscape(id)+"?revoked="+strconv.FormatUint(resp.Msg.Sequence, 10), http.StatusSeeOther)
}

// ---- stop proposals ----

func (c *Console) decide(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id := r.PathValue("id")
	// Only a pending proposal is decided, and DecideProposal checks that in
	// the transaction that decides it: the console does not read the
	// proposals first (there was no way to read one but all of them, and a
	// rogue's tree files as many as it likes over time).
	if expected := r.PostForm.Get("expected_state"); expected != "pending" {
		c.fail(w, r, s, http.StatusConflict, "refused: the page was stale",
			fmt.Sprintf("Stop proposal %s showed %s on the page you acted from; only a pending proposal is decided. Nothing was done; look again before acting.", linked(id), orUnknown(expected)))
		return
	}
	resp, err := s.clients.Supervisor.DecideProposal(ctx, connect.NewRequest(&tetherv1.DecideProposalRequest{
		ProposalId: id, Approve: r.PostForm.Get("decision") == "approve", Reason: strings.TrimSpace(r.PostForm.Get("reason")),
	}))
	if connect.CodeOf(err) == connect.CodeFailedPrecondition {
		c.fail(w, r, s, http.StatusConflict, "refused: the page was stale",
			"The page you acted from showed stop proposal "+linked(id)+" pending, but the server says: "+errorText(err)+". Nothing was done; look again before acting.")
		return
	}
	if err != nil {
		c.apiFail(w, r, s, "The server refused the decision on "+linked(id), err)
		return
	}
	if t := resp.Msg.Termination; t != nil {
		http.Redirect(w, r, "/ui/terminations/"+url.PathEscape(t.TerminationId), http.StatusSeeOther)
		return
	}
	p := resp.Msg.Proposal
	if err := answered("stop proposal", id, p.GetProposalId(), p != nil); err != nil || p.NodeId == "" {
		c.apiFail(w, r, s, "The decision on "+linked(id)+" was sent, and its answer could not be read", cmp.Or(err, answered("node", "", "", false)))
		return
	}
	http.Redirect(w, r, "/ui/nodes/"+url.PathEscape(p.NodeId), http.StatusSeeOther)
}

// ---- rollouts ----

func (c *Console) rollouts(w http.ResponseWriter, r *http.Request, s *session) {
	resp, ok := pageCall(c, w, r, s, "Could not list rollouts", s.clients.Supervisor.ListRollouts, &tetherv1.ListRolloutsRequest{})
	if !ok {
		return
	}
	c.render(w, r, s, http.StatusOK, "rollouts", "Rollouts", resp.Msg.Rollouts)
}

type rolloutData struct {
	Rollout *tetherv1.Rollout
	State   string
	Version string
	Done    uint32
	Total   uint32
}

func (c *Console) rollout(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	resp, ok := pageCall(c, w, r, s, "Could not read rollout "+linked(id), s.clients.Supervisor.GetRollout, &tetherv1.GetRolloutRequest{RolloutId: id})
	if !ok {
		return
	}
	ro := resp.Msg.Rollout
	if err := answered("rollout", id, ro.GetRolloutId(), ro != nil); err != nil {
		c.apiFail(w, r, s, "Could not read rollout "+linked(id), err)
		return
	}
	d := rolloutData{Rollout: ro, State: enumName(ro.State.String(), "ROLLOUT_STATE_"), Version: rolloutVersion(ro)}
	d.Done = ro.GetCounts().GetDrained()
	d.Total = d.Done + ro.GetCounts().GetRemaining()
	c.render(w, r, s, http.StatusOK, "rollout", "Rollout "+id, d)
}

// rolloutVersion identifies what the page draws of a rollout but its
// counts, so the page reloads only when the rollout moved (its state,
// reason or batches), not when its counts did. The agents move a
// rollout's counts: one that spawns a child labelled like the agents
// being replaced moves its remaining count, and each move reloaded the
// page, two of the operator's requests for one of the agent's (rogue48i
// test); the page writes a move of the counts from the event itself
// (rolloutCounts).
func rolloutVersion(ro *tetherv1.Rollout) string {
	shape := proto.Clone(ro).(*tetherv1.Rollout)
	shape.Counts, shape.UpdatedAt = nil, nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(shape)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// rolloutCounts is what the rollout's page shows of its counts, as its
// event carries them.
func rolloutCounts(ro *tetherv1.Rollout) map[string]any {
	c := ro.GetCounts()
	return map[string]any{
		"done":        c.GetDrained(),
		"total":       c.GetDrained() + c.GetRemaining(),
		"ready":       c.GetReplacementsReady(),
		"unavailable": c.GetUnavailable(),
		"handed_over": c.GetLeasesHandedOver(),
	}
}

func (c *Console) rolloutEvents(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, cancel := streamContext(r, s)
	defer cancel()
	stream, err := s.clients.Supervisor.WatchRollout(ctx, connect.NewRequest(&tetherv1.WatchRolloutRequest{RolloutId: id}))
	relayEvents(c, w, r, s, "Could not watch rollout "+linked(id), stream, err, func(send sendEvent, m *tetherv1.WatchRolloutResponse) bool {
		ro := m.Rollout
		if err := answered("rollout", id, ro.GetRolloutId(), ro != nil); err != nil {
			_ = send("failed", map[string]string{"error": errorText(err)})
			return false
		}
		return send("rollout", map[string]any{"version": rolloutVersion(ro), "state": enumName(ro.State.String(), "ROLLOUT_STATE_"), "counts": rolloutCounts(ro)}) == nil
	})
}

func (c *Console) rolloutAction(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := pageContext(r)
	defer cancel()
	id, op := r.PathValue("id"), r.PathValue("op")
	got, ok := apiCall(ctx, c, w, r, s, "Could not read rollout "+linked(id), s.clients.Supervisor.GetRollout, &tetherv1.GetRolloutRequest{RolloutId: id})
	if !ok {
		return
	}
	if err := answered("rollout", id, got.Msg.Rollout.GetRolloutId(), got.Msg.Rollout != nil); err != nil {
		c.apiFail(w, r, s, "Could not read rollout "+linked(id), err)
		return
	}
	if now, expected := enumName(got.Msg.Rollout.State.String(), "ROLLOUT_STATE_"), r.PostForm.Get("expected_state"); expected == "" || now != expected {
		c.stale(w, r, s, "Rollout "+linked(id), orUnknown(expected), now)
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	var err error
	switch op {
	case "pause":
		_, err = s.clients.Supervisor.PauseRollout(ctx, connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: id, Reason: reason}))
	case "resume":
		_, err = s.clients.Supervisor.ResumeRollout(ctx, connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: id}))
	case "abort":
		_, err = s.clients.Supervisor.AbortRollout(ctx, connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: id, Reason: reason}))
	default:
		err = connect.NewError(connect.CodeInvalidArgument, errors.New("a rollout can be paused, resumed or aborted"))
	}
	if err != nil {
		c.apiFail(w, r, s, "The server refused to "+linked(op)+" rollout "+linked(id), err)
		return
	}
	http.Redirect(w, r, "/ui/rollouts/"+url.PathEscape(id), http.StatusSeeOther)
}

// ---- the revocation feed ----

// feedPage is a page of the feed older than what the live page shows
// (?before=): the live page follows the newest feedRows only, and skips
// to the newest when it falls behind, so the older ones are a page away.
type feedPage struct {
	Before     uint64
	Tombstones []*tetherv1.Tombstone // newest first
	// Older is the ?before= of the page of older tombstones (0: none).
	Older uint64
	Head  uint64
}

func (c *Console) revocations(w http.ResponseWriter, r *http.Request, s *session) {
	raw := r.URL.Query().Get("before")
	if raw == "" {
		c.render(w, r, s, http.StatusOK, "revocations", "Revocation feed", nil)
		return
	}
	before, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || before == 0 {
		c.fail(w, r, s, http.StatusBadRequest, "refused: bad sequence", "before must be a tombstone's sequence, a number above 0.")
		return
	}
	ctx, cancel := pageContext(r)
	defer cancel()
	stream, err := s.clients.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{BeforeSequence: before, Newest: feedRows}))
	if err != nil {
		c.apiFail(w, r, s, "Could not read the revocation feed", err)
		return
	}
	defer stream.Close()
	if !stream.Receive() {
		c.apiFail(w, r, s, "Could not read the revocation feed", cmp.Or(stream.Err(), errors.New("the feed sent nothing")))
		return
	}
	m := stream.Msg()
	d := feedPage{Before: before, Head: m.HeadSequence, Tombstones: m.Tombstones}
	slices.Reverse(d.Tombstones)
	if n := len(d.Tombstones); n == feedRows && d.Tombstones[n-1].Sequence > 1 {
		d.Older = d.Tombstones[n-1].Sequence
	}
	c.render(w, r, s, http.StatusOK, "revocations", fmt.Sprintf("Revocation feed before %d", before), d)
}

type tombstoneJSON struct {
	Sequence  uint64 `json:"sequence"`
	GrantID   string `json:"grant_id"`
	RevokedAt string `json:"revoked_at"`
	Reason    string `json:"reason"`
	// RevokedBy is who revoked it: the reason is the revoker's own text,
	// and an agent's may read like an operator's.
	RevokedBy string `json:"revoked_by"`
}

// feedRows is how many tombstones the revocation feed page shows (its
// script keeps as many rows): the page's stream opens with the newest of
// them only (WatchRevocations' newest), not every live tombstone, so that
// an agent that delegates and revokes as fast as its budget allows cannot
// make the page's opening long.
const feedRows = 500

func (c *Console) revocationEvents(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := streamContext(r, s)
	defer cancel()
	stream, err := s.clients.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{Newest: feedRows}))
	relayEvents(c, w, r, s, "Could not watch revocations", stream, err, func(send sendEvent, m *tetherv1.WatchRevocationsResponse) bool {
		for _, t := range m.Tombstones {
			if send("tombstone", tombstoneJSON{Sequence: t.Sequence, GrantID: t.GrantId, RevokedAt: ts(t.RevokedAt), Reason: t.Reason, RevokedBy: t.RevokedBy}) != nil {
				return false
			}
		}
		return send("head", map[string]any{"head": m.HeadSequence, "server_time": ts(m.ServerTime), "snapshot": m.Snapshot}) == nil
	})
}

func seedHeader() []string { return lease.SeedHeader() }
