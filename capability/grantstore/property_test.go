package grantstore

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/capability"
)

// TestPropertyMarkingIsOrderIndependent runs random trees through random
// revocations, with the marker's steps interleaved at random points and
// its jobs and descendants taken in random order. Whatever the schedule,
// every grant ends up as effective reads it in a copy of the store that
// was never marked at all: the outcome is a function of the revocations
// alone, not of when or in which order the marker ran.
func TestPropertyMarkingIsOrderIndependent(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		grants := map[string]capability.Grant{}
		lookup := func(id string) (capability.Grant, bool) { g, ok := grants[id]; return g, ok }
		nodesOf := map[string][]string{} // a grant's holder ancestors, root first, holder last
		var ids []string

		n := rapid.IntRange(1, 25).Draw(rt, "grants")
		for i := range n {
			id := fmt.Sprintf("g_%02d", i)
			holder := fmt.Sprintf("n_%02d", i)
			if i == 0 || rapid.IntRange(0, 5).Draw(rt, "new root") == 0 {
				g, err := capability.NewRoot(capability.RootRequest{GrantID: id, Issuer: "operator:alice", HolderNodeID: holder, Scopes: []string{"tool:*"}, TTL: time.Hour}, epoch)
				if err != nil {
					rt.Fatal(err)
				}
				grants[id], nodesOf[id] = g, []string{holder}
			} else {
				parent := grants[rapid.SampledFrom(ids).Draw(rt, "parent")]
				if len(parent.Chain)+1 > capability.MaxChainDepth {
					continue
				}
				ttl := time.Duration(rapid.IntRange(0, 60).Draw(rt, "ttl minutes")) * time.Minute
				if epoch.Add(ttl).After(parent.ExpiresAt) {
					ttl = 0
				}
				g, err := capability.Delegate(parent, capability.DelegateRequest{
					GrantID: id, Issuer: capability.AgentPrincipal(parent.HolderNodeID), HolderNodeID: holder, Scopes: []string{"tool:shell"}, TTL: ttl,
				}, nodesOf[parent.GrantID], epoch)
				if err != nil {
					rt.Fatal(err)
				}
				grants[id], nodesOf[id] = g, append(slices.Clone(nodesOf[parent.GrantID]), holder)
			}
			ids = append(ids, id)
		}

		// The marker's work: jobs of directly revoked grants, each a list of
		// descendants still to visit.
		type job struct{ pending []string }
		var jobs []*job
		step := func() {
			live := slices.DeleteFunc(jobs, func(j *job) bool { return len(j.pending) == 0 })
			jobs = live
			if len(jobs) == 0 {
				return
			}
			j := jobs[rapid.IntRange(0, len(jobs)-1).Draw(rt, "job")]
			k := rapid.IntRange(0, len(j.pending)-1).Draw(rt, "descendant")
			id := j.pending[k]
			j.pending = slices.Delete(j.pending, k, k+1)
			marked, ok, err := covered(grants[id], lookup)
			if err != nil {
				rt.Fatalf("covered(%s): %v", id, err)
			}
			if ok {
				grants[id] = marked
			}
		}

		unmarked := maps.Clone(grants) // receives the revocations, never the marker's writes
		now := epoch
		for range rapid.IntRange(0, n).Draw(rt, "revocations") {
			now = now.Add(time.Duration(rapid.IntRange(0, 10).Draw(rt, "minutes later")) * time.Minute)
			id := rapid.SampledFrom(ids).Draw(rt, "revoke")
			// As Service.revokeGrant does: a grant that already reads revoked
			// or expired gets no revocation of its own.
			if effective(grants[id], lookup, now).State != capability.StateActive {
				continue
			}
			revoked, err := capability.Revoke(grants[id], "role:security", []string{capability.RoleSecurity}, "", now)
			if err != nil {
				rt.Fatalf("revoke %s: %v", id, err)
			}
			grants[id], unmarked[id] = revoked, revoked
			j := &job{}
			for _, other := range ids {
				if slices.Contains(grants[other].Chain, id) {
					j.pending = append(j.pending, other)
				}
			}
			jobs = append(jobs, j)
			for range rapid.IntRange(0, 8).Draw(rt, "marker steps") {
				step()
			}
		}
		for len(jobs) > 0 {
			step()
		}
		end := now.Add(time.Hour)
		want := map[string]capability.Grant{}
		for _, id := range ids {
			want[id] = effective(unmarked[id], func(id string) (capability.Grant, bool) { g, ok := unmarked[id]; return g, ok }, end)
		}
		for _, id := range ids {
			got := effective(grants[id], lookup, end)
			w := want[id]
			if got.State != w.State || got.RevokedVia != w.RevokedVia || !got.RevokedAt.Equal(w.RevokedAt) {
				rt.Fatalf("%s: %v via %q at %v once marked, but %v via %q at %v unmarked", id,
					got.State, got.RevokedVia, got.RevokedAt, w.State, w.RevokedVia, w.RevokedAt)
			}
			if stored := grants[id]; w.State == capability.StateRevoked && stored.State != capability.StateRevoked {
				rt.Fatalf("%s reads revoked but the marker left it %v", id, stored.State)
			}
		}
	})
}
