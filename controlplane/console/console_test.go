package console_test

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func TestSignInOpensAServerSideSession(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	if p := b.get("/ui/tree"); p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/signin" {
		t.Fatalf("signed-out tree: %d %s, want a redirect to sign-in", p.status, p.header.Get("Location"))
	}
	p := b.signIn(w.srv.Admin)
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/tree" {
		t.Fatalf("sign-in: %d %s\n%s", p.status, p.header.Get("Location"), p.body)
	}
	cookie := p.header.Get("Set-Cookie")
	for _, want := range []string{"HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(cookie, want) {
			t.Errorf("session cookie %q lacks %s", cookie, want)
		}
	}
	if strings.Contains(cookie, w.srv.Admin) || strings.Contains(cookie, strings.Split(w.srv.Admin, ".")[1]) {
		t.Fatal("the session cookie carries the token")
	}
	tree := b.get("/ui/tree")
	if tree.status != http.StatusOK {
		t.Fatalf("tree: %d\n%s", tree.status, tree.body)
	}
	for _, name := range []string{"planner", "worker-1", "worker-2", "helper", "rogue"} {
		if !strings.Contains(tree.body, ">"+name+"</a>") {
			t.Errorf("the tree does not show %s", name)
		}
	}
	if strings.Contains(tree.body, w.srv.Admin) {
		t.Fatal("a page carries the token")
	}
	for k, want := range map[string]string{
		"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
	} {
		if got := tree.header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if csp := tree.header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
		t.Errorf("Content-Security-Policy %q is not strict", csp)
	}

	// Signing out ends the session on the server: the old cookie opens nothing.
	jarCookies := b.hc.Jar.Cookies(mustURL(t, w.srv.URL+"/ui/"))
	out := b.post("/ui/signout", url.Values{"csrf": {b.csrf("/ui/tree")}}, b.sameOrigin())
	if out.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d\n%s", out.status, out.body)
	}
	replay := newBrowser(t, w.srv.URL)
	replay.hc.Jar.SetCookies(mustURL(t, w.srv.URL+"/ui/"), jarCookies)
	if p := replay.get("/ui/tree"); p.status != http.StatusSeeOther {
		t.Fatalf("the signed-out session still opens the tree: %d", p.status)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestAgentCredentialsAndBadTokensCannotSignIn(t *testing.T) {
	w := newWorld(t)
	for name, token := range map[string]string{
		"an agent credential": w.creds["worker-1"],
		"garbage":             "not-a-token",
		"a tampered token":    w.srv.Admin[:len(w.srv.Admin)-4] + "AAAA",
	} {
		b := newBrowser(t, w.srv.URL)
		p := b.signIn(token)
		if p.status == http.StatusSeeOther || p.header.Get("Set-Cookie") != "" {
			t.Errorf("%s signed in: %d", name, p.status)
		}
		if !strings.Contains(p.body, `id="signin-error"`) {
			t.Errorf("%s: no reason shown:\n%s", name, p.body)
		}
		if strings.Contains(p.body, token) {
			t.Errorf("%s: the page echoes the token", name)
		}
	}
	b := newBrowser(t, w.srv.URL)
	if p := b.signIn(w.creds["worker-1"]); !strings.Contains(p.body, "agent credential") {
		t.Errorf("an agent credential is refused without saying why:\n%s", p.body)
	}
	// A token that expires ends its session with it (manual clock).
	b = newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	if p := b.get("/ui/tree"); p.status != http.StatusOK {
		t.Fatalf("viewer tree: %d", p.status)
	}
	w.clk.Advance(time.Hour + time.Second)
	if p := b.get("/ui/tree"); p.status != http.StatusSeeOther {
		t.Fatalf("the session outlived its token: %d", p.status)
	}
}

func terminateForm(csrf, expected, mode string) url.Values {
	return url.Values{"csrf": {csrf}, "expected_state": {expected}, "mode": {mode}, "drain_window": {"1m"}, "reason": {"test"}}
}

func TestForgedFormPostsAreRefused(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	target := "/ui/nodes/" + w.nodes["worker-1"].NodeId
	csrf := b.csrf(target)
	cases := []struct {
		name    string
		form    url.Values
		headers map[string]string
	}{
		{"no CSRF token", terminateForm("", "running", "abort"), b.sameOrigin()},
		{"a wrong CSRF token", terminateForm(csrf+"x", "running", "abort"), b.sameOrigin()},
		{"another session's CSRF token", terminateForm(otherCSRF(t, w, target), "running", "abort"), b.sameOrigin()},
		{"a foreign Origin", terminateForm(csrf, "running", "abort"), map[string]string{"Origin": "https://evil.example"}},
		{"a cross-site fetch", terminateForm(csrf, "running", "abort"), map[string]string{"Sec-Fetch-Site": "cross-site"}},
	}
	for _, c := range cases {
		p := b.post(target+"/terminate", c.form, c.headers)
		if p.status != http.StatusForbidden || !strings.Contains(p.body, "refused") {
			t.Errorf("%s: %d, want 403 refused\n%s", c.name, p.status, p.body)
		}
	}
	// A forged sign-in (login CSRF) is refused too.
	if p := b.post("/ui/signin", url.Values{"token": {w.srv.Admin}}, map[string]string{"Origin": "https://evil.example"}); p.status != http.StatusForbidden {
		t.Errorf("cross-origin sign-in: %d, want 403", p.status)
	}
	if got := w.node(t, "worker-1").State; got != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("a refused post changed worker-1 to %s", got)
	}
	// The same form with the session's token and a same-origin request acts.
	p := b.post(target+"/terminate", terminateForm(csrf, "running", "drain"), b.sameOrigin())
	if p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/ui/terminations/t_") {
		t.Fatalf("the genuine post: %d %s\n%s", p.status, p.header.Get("Location"), p.body)
	}
}

func otherCSRF(t *testing.T, w *world, path string) string {
	other := newBrowser(t, w.srv.URL)
	other.signIn(w.srv.Admin)
	return other.csrf(path)
}

func TestViewerSeesButCannotAct(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	if p := b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER)); p.status != http.StatusSeeOther {
		t.Fatalf("viewer sign-in: %d\n%s", p.status, p.body)
	}
	target := "/ui/nodes/" + w.nodes["worker-1"].NodeId
	node := b.get(target)
	if node.status != http.StatusOK || !strings.Contains(node.body, w.grants["worker-1"]) {
		t.Fatalf("the viewer does not see worker-1 and its grant: %d\n%s", node.status, node.body)
	}
	for _, action := range []string{`id="terminate-form"`, "/revoke", `value="approve"`} {
		if strings.Contains(node.body, action) {
			t.Errorf("the viewer's node page offers %s", action)
		}
	}
	// A viewer who crafts the post anyway (a valid session and CSRF token)
	// is refused by the API's own authorisation, with the server's words.
	csrf := b.csrf(target)
	p := b.post(target+"/terminate", terminateForm(csrf, "running", "abort"), b.sameOrigin())
	if p.status != http.StatusForbidden || !strings.Contains(p.body, "permission_denied") || !strings.Contains(p.body, "role viewer may not call") {
		t.Errorf("viewer terminate: %d\n%s", p.status, p.body)
	}
	p = b.post("/ui/grants/"+w.grants["worker-1"]+"/revoke", url.Values{"csrf": {csrf}, "expected_state": {"active"}, "confirm": {"yes"}}, b.sameOrigin())
	if p.status != http.StatusForbidden || !strings.Contains(p.body, "permission_denied") {
		t.Errorf("viewer revoke: %d\n%s", p.status, p.body)
	}
	if got := w.node(t, "worker-1").State; got != tetherv1.NodeState_NODE_STATE_RUNNING {
		t.Fatalf("the viewer changed worker-1 to %s", got)
	}
	g, err := w.admin.Capability.GetGrant(context.Background(), connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: w.grants["worker-1"]}))
	if err != nil || g.Msg.Grant.State != tetherv1.GrantState_GRANT_STATE_ACTIVE {
		t.Fatalf("the viewer's revoke changed the grant: %v %v", g.Msg.GetGrant().GetState(), err)
	}
}

func TestStalePageNeverActs(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	target := "/ui/nodes/" + w.nodes["worker-2"].NodeId
	csrf := b.csrf(target) // the page shows worker-2 running
	// Meanwhile someone else drains worker-2.
	if _, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.nodes["worker-2"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN})); err != nil {
		t.Fatal(err)
	}
	// The drain marks the node asynchronously: count once it has (the
	// count reads the nodes' termination ids).
	testserver.WaitFor(t, 20*time.Second, "the drain to mark worker-2", func() bool {
		n, err := w.admin.Agent.GetNode(context.Background(), connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: w.nodes["worker-2"].NodeId}))
		return err == nil && n.Msg.Node.TerminationId != ""
	})
	before := len(listTerminations(t, w))
	p := b.post(target+"/terminate", terminateForm(csrf, "running", "abort"), b.sameOrigin())
	if p.status != http.StatusConflict || !strings.Contains(p.body, "stale") || !strings.Contains(p.body, "showed running") {
		t.Fatalf("stale terminate: %d\n%s", p.status, p.body)
	}
	if after := len(listTerminations(t, w)); after != before {
		t.Fatalf("a stale page started a termination (%d → %d)", before, after)
	}
	// A grant revoked elsewhere: the confirmation page's form is stale.
	grant := "/ui/grants/" + w.grants["helper"] + "/revoke"
	csrf = b.csrf(grant)
	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grants["helper"]}})); err != nil {
		t.Fatal(err)
	}
	p = b.post(grant, url.Values{"csrf": {csrf}, "expected_state": {"active"}, "confirm": {"yes"}}, b.sameOrigin())
	if p.status != http.StatusConflict || !strings.Contains(p.body, "is revoked now") {
		t.Fatalf("stale revoke: %d\n%s", p.status, p.body)
	}
}

// listTerminations reads the terminations through the nodes that name one.
func listTerminations(t *testing.T, w *world) map[string]bool {
	resp, err := w.admin.Agent.ListNodes(context.Background(), connect.NewRequest(&tetherv1.ListNodesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, n := range resp.Msg.Nodes {
		if n.TerminationId != "" {
			out[n.TerminationId] = true
		}
	}
	return out
}

func TestRevokeNeedsConfirmationAndShowsTheServersAnswer(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_SECURITY))
	confirm := b.get("/ui/grants/" + w.grants["worker-1"] + "/revoke")
	if confirm.status != http.StatusOK || !strings.Contains(confirm.body, "cannot be undone") || !strings.Contains(confirm.body, w.grants["rogue"]) {
		t.Fatalf("confirmation page: %d\n%s", confirm.status, confirm.body)
	}
	csrf := csrfField.FindStringSubmatch(confirm.body)[1]
	if p := b.post("/ui/grants/"+w.grants["worker-1"]+"/revoke", url.Values{"csrf": {csrf}, "expected_state": {"active"}}, b.sameOrigin()); p.status != http.StatusBadRequest {
		t.Fatalf("an unconfirmed revoke: %d", p.status)
	}
	p := b.post("/ui/grants/"+w.grants["worker-1"]+"/revoke", url.Values{"csrf": {csrf}, "expected_state": {"active"}, "confirm": {"yes"}, "reason": {"leak"}}, b.sameOrigin())
	if p.status != http.StatusSeeOther {
		t.Fatalf("revoke: %d\n%s", p.status, p.body)
	}
	g := b.get(p.header.Get("Location"))
	if !strings.Contains(g.body, `id="revoked-notice"`) || !strings.Contains(g.body, `id="grant-state">revoked`) {
		t.Fatalf("the grant page after revoking:\n%s", g.body)
	}
	// An error from the server is shown as the server said it.
	missing := b.get("/ui/nodes/n_doesnotexist0000000000")
	if missing.status != http.StatusNotFound && missing.status != http.StatusBadRequest {
		t.Fatalf("missing node: %d", missing.status)
	}
	if !strings.Contains(missing.body, "not_found:") && !strings.Contains(missing.body, "invalid_argument:") {
		t.Fatalf("the server's error is not shown:\n%s", missing.body)
	}
}

func TestRecordAndEvidenceDownloads(t *testing.T) {
	w := newWorld(t)
	term, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.nodes["worker-1"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_ABORTING)
	w.clk.Advance(time.Hour) // the rogue's gate never acknowledges the cancel
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_RECONCILING)
	for _, n := range []string{"worker-1", "helper"} {
		if _, err := w.admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.nodes[n].NodeId})); err != nil {
			t.Fatal(err)
		}
	}
	w.clk.Advance(time.Hour)
	done := w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)

	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	rec := b.get("/ui/records/" + done.RecordId)
	if rec.status != http.StatusOK {
		t.Fatalf("record page: %d\n%s", rec.status, rec.body)
	}
	if !strings.Contains(rec.body, `class="bad unaccounted" data-node="`+w.nodes["rogue"].NodeId+`"`) {
		t.Fatalf("the rogue is not marked unaccounted:\n%s", rec.body)
	}
	if strings.Contains(rec.body, `data-node="`+w.nodes["helper"].NodeId+`"`) {
		t.Fatal("the helper, which confirmed its exit, is marked unaccounted")
	}
	for _, want := range []string{`id="unresolved-calls"`, "cancel_unacknowledged", `id="failed-revocations"`, "webhook answered 503", "/data/train.lock"} {
		if !strings.Contains(rec.body, want) {
			t.Errorf("the record page does not show %s", want)
		}
	}
	list := b.get("/ui/records")
	if !strings.Contains(list.body, done.RecordId) || !strings.Contains(list.body, `class="attention"`) {
		t.Fatalf("records list:\n%s", list.body)
	}
	js := b.get("/ui/records/" + done.RecordId + "/json")
	var decoded map[string]any
	if err := json.Unmarshal([]byte(js.body), &decoded); err != nil || decoded["recordId"] != done.RecordId {
		t.Fatalf("record JSON: %v %v\n%s", err, decoded["recordId"], js.body)
	}
	if cd := js.header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment") {
		t.Fatalf("record JSON is not a download: %q", cd)
	}

	ev := b.get("/ui/jobs/job-1/evidence/csv")
	rows, err := csv.NewReader(strings.NewReader(ev.body)).ReadAll()
	if err != nil {
		t.Fatalf("evidence CSV: %v\n%s", err, ev.body)
	}
	if len(rows[0]) != 18 || rows[0][7] != "ACK Deadline/State" || rows[0][17] != "Reason" {
		t.Fatalf("evidence header: %q", rows[0])
	}
	if len(rows) < 4 {
		t.Fatalf("evidence rows: %d, want offer, ack, the rejected ack and the cancellation", len(rows)-1)
	}
	for _, row := range rows[1:] {
		for _, cell := range row {
			if strings.HasPrefix(cell, "=") {
				t.Fatalf("a cell the agent wrote is a live spreadsheet formula: %q", cell)
			}
		}
	}
	if !strings.Contains(ev.body, `=HYPERLINK(""http://evil.example""`) {
		t.Fatalf("the agent's progress value is not in the CSV:\n%s", ev.body)
	}
	rejected := b.get("/ui/jobs/job-1/evidence/csv?outcome=rejected")
	rrows, _ := csv.NewReader(strings.NewReader(rejected.body)).ReadAll()
	if len(rrows) != 2 || !strings.HasPrefix(rrows[1][16], "REJECTED") {
		t.Fatalf("rejected rows: %q", rrows)
	}
}

func TestTerminationProgressIsStreamed(t *testing.T) {
	w := newWorld(t)
	term, err := w.admin.Supervisor.Terminate(context.Background(), connect.NewRequest(&tetherv1.TerminateRequest{NodeId: w.nodes["worker-2"].NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT}))
	if err != nil {
		t.Fatal(err)
	}
	id := term.Msg.Termination.TerminationId
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	req, _ := http.NewRequest("GET", w.srv.URL+"/ui/terminations/"+id+"/events", nil)
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, ct)
	}
	events := make(chan map[string]any)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			if e, ok := strings.CutPrefix(line, "event: "); ok {
				event = e
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok && event == "termination" {
				var m map[string]any
				_ = json.Unmarshal([]byte(data), &m)
				events <- m
			}
		}
	}()
	first := <-events
	if first["id"] != id {
		t.Fatalf("first event: %v", first)
	}
	// The termination moves (an exit is confirmed, then the timeout passes):
	// each move arrives on the stream, up to terminated with the record.
	if _, err := w.admin.Agent.ConfirmExit(context.Background(), connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: w.nodes["worker-2"].NodeId})); err != nil {
		t.Fatal(err)
	}
	w.waitTermination(t, id, tetherv1.TerminationState_TERMINATION_STATE_TERMINATED)
	var last map[string]any
	for m := range events {
		last = m
		if m["state"] == "terminated" && m["record_id"] != "" {
			break
		}
	}
	if last["state"] != "terminated" || last["confirmations"] != float64(1) {
		t.Fatalf("last event: %v", last)
	}
}

func TestNodePageShowsCallsInFlightAndPrivileges(t *testing.T) {
	w := newWorld(t)
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	p := b.get("/ui/nodes/" + w.nodes["rogue"].NodeId)
	if p.status != http.StatusOK {
		t.Fatalf("node page: %d\n%s", p.status, p.body)
	}
	for _, want := range []string{
		"Tool calls in flight (1)", "gate-http", "in_flight",
		"Privileges (1)", "/data/train.lock", "file_lock", "webhook",
		"Grants (1)", w.grants["planner"] + "</code></a> → ", w.grants["worker-1"] + "</code></a> → <code>" + w.grants["rogue"],
		"agent:" + w.nodes["worker-1"].NodeId, // a revoker: the issuer of the rogue's grant
	} {
		if !strings.Contains(p.body, want) {
			t.Errorf("the rogue's node page does not show %q", want)
		}
	}
	if strings.Contains(p.body, "s3cr3t-webhook-key") {
		t.Fatal("the node page shows the privilege's revoke_url")
	}
	// The RPCs behind the page: operators only, and no revoke_url.
	privs, err := w.admin.Supervisor.ListPrivileges(context.Background(), connect.NewRequest(&tetherv1.ListPrivilegesRequest{NodeId: w.nodes["rogue"].NodeId}))
	if err != nil || len(privs.Msg.Privileges) != 1 || privs.Msg.Privileges[0].Revoker != "webhook" || strings.Contains(privs.Msg.String(), "s3cr3t") {
		t.Fatalf("ListPrivileges: %v %v", privs.Msg, err)
	}
	if _, err := w.srv.Clients(w.creds["rogue"]).Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: w.nodes["rogue"].NodeId})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("an agent listed calls: %v", err)
	}
	if _, err := w.admin.Tool.ListCalls(context.Background(), connect.NewRequest(&tetherv1.ListCallsRequest{NodeId: "n_doesnotexist0000000000"})); connect.CodeOf(err) != connect.CodeNotFound && connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("ListCalls of a missing node: %v", err)
	}
}

func TestOneTokenCannotFillTheSessionTable(t *testing.T) {
	w := newWorld(t)
	viewer := w.token(t, tetherv1.Role_ROLE_VIEWER)
	first := newBrowser(t, w.srv.URL)
	first.signIn(viewer)
	for range 32 {
		newBrowser(t, w.srv.URL).signIn(viewer)
	}
	if p := first.get("/ui/tree"); p.status != http.StatusSeeOther {
		t.Fatalf("the oldest of 33 sessions of one operator is still open: %d", p.status)
	}
	// Another operator signs in as usual.
	other := newBrowser(t, w.srv.URL)
	if p := other.signIn(w.srv.Admin); p.status != http.StatusSeeOther || p.header.Get("Location") != "/ui/tree" {
		t.Fatalf("admin sign-in: %d", p.status)
	}
}

func TestRolloutPagesAndActions(t *testing.T) {
	w := newWorld(t)
	resp, err := w.admin.Supervisor.Rollout(context.Background(), connect.NewRequest(&tetherv1.RolloutRequest{Selector: "role=worker", TargetSelector: "version=v2", Batch: 1, Description: "model v2"}))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Msg.Rollout.RolloutId
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.srv.Admin)
	if list := b.get("/ui/rollouts"); !strings.Contains(list.body, id) || !strings.Contains(list.body, "role=worker → version=v2") {
		t.Fatalf("rollouts list:\n%s", list.body)
	}
	page := b.get("/ui/rollouts/" + id)
	if page.status != http.StatusOK || !strings.Contains(page.body, `action="/ui/rollouts/`+id+`/pause"`) {
		t.Fatalf("rollout page: %d\n%s", page.status, page.body)
	}
	csrf := csrfField.FindStringSubmatch(page.body)[1]
	// A page that showed the rollout paused is stale: refused.
	if p := b.post("/ui/rollouts/"+id+"/resume", url.Values{"csrf": {csrf}, "expected_state": {"paused"}}, b.sameOrigin()); p.status != http.StatusConflict {
		t.Fatalf("stale resume: %d\n%s", p.status, p.body)
	}
	if p := b.post("/ui/rollouts/"+id+"/pause", url.Values{"csrf": {csrf}, "expected_state": {"running"}, "reason": {"hold"}}, b.sameOrigin()); p.status != http.StatusSeeOther {
		t.Fatalf("pause: %d\n%s", p.status, p.body)
	}
	got, err := w.admin.Supervisor.GetRollout(context.Background(), connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: id}))
	if err != nil || got.Msg.Rollout.State != tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
		t.Fatalf("after pause: %v %v", got.Msg.GetRollout().GetState(), err)
	}
	if p := b.get("/ui/rollouts/" + id); !strings.Contains(p.body, `action="/ui/rollouts/`+id+`/resume"`) {
		t.Fatalf("the paused rollout's page offers no resume:\n%s", p.body)
	}
}

func TestRevocationFeedIsStreamed(t *testing.T) {
	w := newWorld(t)
	if _, err := w.admin.Capability.Revoke(context.Background(), connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_GrantId{GrantId: w.grants["worker-2"]}, Reason: "leaked"})); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, w.srv.URL)
	b.signIn(w.token(t, tetherv1.Role_ROLE_VIEWER))
	if p := b.get("/ui/revocations"); p.status != http.StatusOK || !strings.Contains(p.body, `id="feed"`) {
		t.Fatalf("feed page: %d", p.status)
	}
	resp, err := b.hc.Get(w.srv.URL + "/ui/revocations/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(data, `"grant_id"`) {
			if !strings.Contains(data, w.grants["worker-2"]) || !strings.Contains(data, "leaked") {
				t.Fatalf("tombstone event: %s", data)
			}
			return
		}
	}
	t.Fatalf("the stream ended without a tombstone: %v", sc.Err())
}
