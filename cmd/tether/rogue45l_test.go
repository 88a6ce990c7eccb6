package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// The forty-fifth hostile pass on the CLI (letter L): a rogue path to the
// control plane (a proxy, or a replica under a rogue's control, on a
// connection without TLS) in front of a real server answers a command's
// call with an answer that lacks the object the command prints.

// rogue45lRun runs the CLI with args against addr and reports what it
// printed, its error, and the panic it raised, if it did.
func rogue45lRun(addr, token string, args ...string) (out string, err error, panicked any) {
	cmd := newRootCommand()
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetErr(&buf)
	cmd.SetArgs(append([]string{"--addr", addr, "--token", token}, args...))
	defer func() {
		if p := recover(); p != nil {
			out, panicked = buf.String(), p
		}
	}()
	err = cmd.Execute()
	return buf.String(), err, nil
}

// TestRogue45LSingleAnswersWithoutTheirObjectAreRefused: the path answers
// each command's call with the procedure's answer emptied (a valid answer
// on the wire, carrying none of what the control plane's always carries:
// the node, the token, the rule, the rollout, the termination, the grant,
// the lease, the decision, the policy). `agent spawn`, `token revoke`, `rule add`,
// `rule rm`, `rollout start`, `rollout status`, pause, resume, abort,
// `terminate`, `termination show`, `grant root`, `grant delegate`, `grant
// show`, `lease show` and `lease policy` read the object without looking
// for it: a panic. `agent register --print credential` printed an empty
// credential (for a shell variable), `lease offer` (as every lease
// mutation) an UNSPECIFIED decision, `token create` and `token refresh`
// an empty token, `token rotate-admin` wrote an empty admin token over
// the old file (the old token, still valid, then in no file), and
// `proposal approve` printed "rejected" for an approval. Each is now an
// error naming what the answer lacked, and nothing is written.
func TestRogue45LSingleAnswersWithoutTheirObjectAreRefused(t *testing.T) {
	srv := testserver.Start(t)
	api := srv.Handler()
	forged := map[string]bool{}
	addr := serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := strings.LastIndex(r.URL.Path, "/")
		if !forged[r.URL.Path[i+1:]] {
			api.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/proto")
		w.WriteHeader(http.StatusOK) // the empty answer: every field absent
	}))
	adminFile := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(adminFile, []byte(srv.Admin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		procedure string
		args      []string
		lacked    string
	}{
		{"RegisterRoot", []string{"agent", "register", "--name", "planner", "--print", "credential"}, "node"},
		{"Spawn", []string{"agent", "spawn", "--parent", "n_some", "--name", "worker"}, "node"},
		{"CreateToken", []string{"token", "create", "--role", "viewer"}, "token"},
		{"RevokeToken", []string{"token", "revoke", "t_gone"}, "token"},
		{"CreateToken", []string{"token", "rotate-admin", "--out", adminFile}, "token"},
		{"Refresh", []string{"token", "refresh", "g_some"}, "token"},
		{"AddStopRule", []string{"rule", "add", "--node", "n_some", "--name", "cap", "true"}, "rule"},
		{"RemoveStopRule", []string{"rule", "rm", "r_some"}, "rule"},
		{"Rollout", []string{"rollout", "start", "--selector", "v=1", "--target", "v=2"}, "rollout"},
		{"GetRollout", []string{"rollout", "status", "ro_some"}, "rollout"},
		{"PauseRollout", []string{"rollout", "pause", "ro_some"}, "rollout"},
		{"ResumeRollout", []string{"rollout", "resume", "ro_some"}, "rollout"},
		{"AbortRollout", []string{"rollout", "abort", "ro_some"}, "rollout"},
		{"Terminate", []string{"terminate", "n_some"}, "termination"},
		{"GetTermination", []string{"termination", "show", "t_some"}, "termination"},
		{"DecideProposal", []string{"proposal", "approve", "p_some"}, "termination"},
		{"IssueRoot", []string{"grant", "root", "--holder", "n_some", "--scope", "tool:http"}, "grant"},
		{"Delegate", []string{"grant", "delegate", "--from", "g_some", "--holder", "n_some", "--scope", "tool:http"}, "grant"},
		{"GetGrant", []string{"grant", "show", "g_some"}, "grant"},
		{"Offer", []string{"lease", "offer", "job-some", "--holder", "n_some"}, "decision"},
		{"GetLease", []string{"lease", "show", "job-some"}, "lease"},
		{"GetPolicy", []string{"lease", "policy"}, "policy"},
	}
	var panics, accepted []string
	for _, tc := range cases {
		clear(forged)
		forged[tc.procedure] = true
		name := strings.Join(tc.args[:2], " ")
		out, err, p := rogue45lRun(addr, srv.Admin, tc.args...)
		switch {
		case p != nil:
			panics = append(panics, fmt.Sprintf("%s: %v", name, p))
		case err == nil:
			accepted = append(accepted, fmt.Sprintf("%s: %q", name, out))
		case !strings.Contains(err.Error(), "the answer carried no "+tc.lacked+": it is not the control plane's"):
			t.Errorf("tether %s refuses a forged answer without saying it carried no %s: %v", name, tc.lacked, err)
		}
	}
	if b, err := os.ReadFile(adminFile); err != nil || string(b) != srv.Admin+"\n" {
		t.Errorf("tether token rotate-admin wrote a forged answer's token over the admin token (%v): %q", err, b)
	}
	if len(panics) > 0 || len(accepted) > 0 {
		t.Errorf("of %d forged answers without their object, %d panicked and %d were taken:\n%s\n%s",
			len(cases), len(panics), len(accepted), strings.Join(panics, "\n"), strings.Join(accepted, "\n"))
	}
}

// TestRogue45LWatchedUpdatesWithoutTheirObjectAreRefused: `terminate
// --wait` and `rollout status --watch` print each update of a watch. The
// path lets the real Terminate through and answers the watch with one
// update that lacks the termination (or the rollout): both read it
// without looking for it, a panic. Each is now an error naming what the
// update lacked.
func TestRogue45LWatchedUpdatesWithoutTheirObjectAreRefused(t *testing.T) {
	srv := testserver.Start(t)
	api := srv.Handler()
	addr := serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/WatchTermination") && !strings.HasSuffix(r.URL.Path, "/WatchRollout") {
			api.ServeHTTP(w, r)
			return
		}
		// Connect's streaming envelope: one empty message (flags 0,
		// length 0), then the end of the stream (flags 2, "{}").
		w.Header().Set("Content-Type", "application/connect+proto")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte{0, 0, 0, 0, 0, 2, 0, 0, 0, 2, '{', '}'})
	}))
	root := mustCLI(t, srv.URL, srv.Admin, "agent", "register", "--name", "planner", "--print", "node_id")
	var panics []string
	for _, tc := range []struct {
		args   []string
		lacked string
	}{
		{[]string{"terminate", strings.TrimSpace(root), "--mode", "abort", "--wait"}, "termination"},
		{[]string{"rollout", "status", "ro_some", "--watch"}, "rollout"},
	} {
		name := strings.Join(tc.args[:2], " ")
		_, err, p := rogue45lRun(addr, srv.Admin, tc.args...)
		switch {
		case p != nil:
			panics = append(panics, fmt.Sprintf("%s: %v", name, p))
		case err == nil || !strings.Contains(err.Error(), "the answer carried no "+tc.lacked+": it is not the control plane's"):
			t.Errorf("tether %s takes a watched update without its %s: %v", name, tc.lacked, err)
		}
	}
	if len(panics) > 0 {
		t.Errorf("of 2 forged watch updates without their object, %d panicked:\n%s", len(panics), strings.Join(panics, "\n"))
	}
}

// TestRogue45LAnswersOfAnotherObjectAreRefused: the path answers a
// command that names its object with another object of the kind (another
// grant, termination, rollout, lease, rule, token): `grant show`,
// `termination show`, `rollout status` and its pause, resume and abort,
// `lease show`, `rule rm`, `token revoke` and the updates of `terminate
// --wait` and `rollout status --watch` printed the other under the id
// asked for (a revoked token, a removed rule, a paused rollout that were
// not). Each is now an error naming both ids.
func TestRogue45LAnswersOfAnotherObjectAreRefused(t *testing.T) {
	srv := testserver.Start(t)
	api := srv.Handler()
	var answer proto.Message
	forged := ""
	addr := serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := strings.LastIndex(r.URL.Path, "/")
		if r.URL.Path[i+1:] != forged {
			api.ServeHTTP(w, r)
			return
		}
		b, err := proto.Marshal(answer)
		if err != nil {
			t.Error(err)
			return
		}
		if strings.HasPrefix(forged, "Watch") {
			w.Header().Set("Content-Type", "application/connect+proto")
			w.WriteHeader(http.StatusOK)
			head := []byte{0, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(head[1:], uint32(len(b)))
			_, _ = w.Write(append(append(head, b...), 2, 0, 0, 0, 2, '{', '}'))
			return
		}
		w.Header().Set("Content-Type", "application/proto")
		_, _ = w.Write(b)
	}))
	root := strings.TrimSpace(mustCLI(t, srv.URL, srv.Admin, "agent", "register", "--name", "planner", "--print", "node_id"))
	other := func(kind string) string { return kind + "_ffffffffffffffffffff" }
	ro := &tetherv1.Rollout{RolloutId: other("ro"), State: tetherv1.RolloutState_ROLLOUT_STATE_PAUSED}
	term := &tetherv1.Termination{TerminationId: other("t"), State: tetherv1.TerminationState_TERMINATION_STATE_TERMINATED}
	cases := []struct {
		procedure string
		answer    proto.Message
		args      []string
		kind, got string
	}{
		{"GetGrant", &tetherv1.GetGrantResponse{Grant: &tetherv1.Grant{GrantId: other("g")}}, []string{"grant", "show", "g_some"}, "grant", other("g")},
		{"GetTermination", &tetherv1.GetTerminationResponse{Termination: term}, []string{"termination", "show", "t_some"}, "termination", other("t")},
		{"GetRollout", &tetherv1.GetRolloutResponse{Rollout: ro}, []string{"rollout", "status", "ro_some"}, "rollout", other("ro")},
		{"PauseRollout", &tetherv1.PauseRolloutResponse{Rollout: ro}, []string{"rollout", "pause", "ro_some"}, "rollout", other("ro")},
		{"ResumeRollout", &tetherv1.ResumeRolloutResponse{Rollout: ro}, []string{"rollout", "resume", "ro_some"}, "rollout", other("ro")},
		{"AbortRollout", &tetherv1.AbortRolloutResponse{Rollout: ro}, []string{"rollout", "abort", "ro_some"}, "rollout", other("ro")},
		{"GetLease", &tetherv1.GetLeaseResponse{Lease: &tetherv1.Lease{JobId: "job-other"}}, []string{"lease", "show", "job-some"}, "lease", "job-other"},
		{"RemoveStopRule", &tetherv1.RemoveStopRuleResponse{Rule: &tetherv1.StopRule{RuleId: other("r")}}, []string{"rule", "rm", "r_some"}, "rule", other("r")},
		{"RevokeToken", &tetherv1.RevokeTokenResponse{Token: &tetherv1.TokenInfo{TokenId: other("tok")}}, []string{"token", "revoke", "tok_some"}, "token", other("tok")},
		{"WatchTermination", &tetherv1.WatchTerminationResponse{Termination: term}, []string{"terminate", root, "--mode", "abort", "--wait"}, "termination", other("t")},
		{"WatchRollout", &tetherv1.WatchRolloutResponse{Rollout: ro}, []string{"rollout", "status", "ro_some", "--watch"}, "rollout", other("ro")},
	}
	var taken []string
	for _, tc := range cases {
		forged, answer = tc.procedure, tc.answer
		name := strings.Join(tc.args[:2], " ")
		out, err, p := rogue45lRun(addr, srv.Admin, tc.args...)
		switch {
		case p != nil:
			t.Errorf("tether %s panics on an answer of another %s: %v", name, tc.kind, p)
		case err == nil:
			taken = append(taken, fmt.Sprintf("%s: %q", name, out))
		case !strings.Contains(err.Error(), "the answer carried "+tc.kind+" "+tc.got+", not ") || !strings.Contains(err.Error(), ": it is not the control plane's"):
			t.Errorf("tether %s refuses an answer of another %s without naming it: %v", name, tc.kind, err)
		}
	}
	if len(taken) > 0 {
		t.Errorf("of %d answers of another object, %d were printed as the one asked for:\n%s", len(cases), len(taken), strings.Join(taken, "\n"))
	}
}
