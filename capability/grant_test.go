package capability_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/capability"
)

// tb is what the helpers need from *testing.T, *testing.B and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

var t0 = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// agentTree is the node tree the grant tests delegate across:
//
//	n_root ─┬─ n_a ─┬─ n_a1 ── n_a1x
//	        │       └─ n_a2
//	        └─ n_b
var agentTree = map[string][]string{
	"n_root": nil,
	"n_a":    {"n_root"},
	"n_a1":   {"n_root", "n_a"},
	"n_a1x":  {"n_root", "n_a", "n_a1"},
	"n_a2":   {"n_root", "n_a"},
	"n_b":    {"n_root"},
}

func mustRoot(t tb, id, holder string, scopes []string, ttl time.Duration, now time.Time) capability.Grant {
	t.Helper()
	g, err := capability.NewRoot(capability.RootRequest{
		GrantID: id, Issuer: "operator:alice", HolderNodeID: holder, Scopes: scopes, TTL: ttl,
	}, now)
	if err != nil {
		t.Fatalf("NewRoot(%s): %v", id, err)
	}
	return g
}

func mustDelegate(t tb, parent capability.Grant, id, holder string, scopes []string, ttl time.Duration, now time.Time) capability.Grant {
	t.Helper()
	g, err := capability.Delegate(parent, capability.DelegateRequest{
		GrantID: id, Issuer: capability.AgentPrincipal(parent.HolderNodeID),
		HolderNodeID: holder, Scopes: scopes, TTL: ttl,
	}, agentTree[holder], now)
	if err != nil {
		t.Fatalf("Delegate(%s): %v", id, err)
	}
	return g
}

// grantTree is the fixture most tests share.
type grantTree struct {
	root, a, a1, a1x, a2, b capability.Grant
}

func newGrantTree(t tb) grantTree {
	t.Helper()
	var tr grantTree
	tr.root = mustRoot(t, "g_root", "n_root", []string{"tool:*", "s3:read:*"}, time.Hour, t0)
	tr.a = mustDelegate(t, tr.root, "g_a", "n_a", []string{"tool:*"}, 30*time.Minute, t0)
	tr.a1 = mustDelegate(t, tr.a, "g_a1", "n_a1", []string{"tool:shell"}, 0, t0)
	tr.a1x = mustDelegate(t, tr.a1, "g_a1x", "n_a1x", []string{"tool:shell"}, 10*time.Minute, t0)
	tr.a2 = mustDelegate(t, tr.a, "g_a2", "n_a2", []string{"tool:fs:*"}, 0, t0)
	tr.b = mustDelegate(t, tr.root, "g_b", "n_b", []string{"s3:read:logs/*"}, 0, t0)
	return tr
}

func (tr grantTree) lookup() capability.GrantLookup {
	byID := map[string]capability.Grant{}
	for _, g := range []capability.Grant{tr.root, tr.a, tr.a1, tr.a1x, tr.a2, tr.b} {
		byID[g.GrantID] = g
	}
	return func(id string) (capability.Grant, bool) {
		g, ok := byID[id]
		return g, ok
	}
}

func TestNewRoot(t *testing.T) {
	g, err := capability.NewRoot(capability.RootRequest{
		GrantID: "g_1", Issuer: "operator:alice", HolderNodeID: "n_root",
		Scopes: []string{"tool:*", "s3:read:*", "tool:*"}, TTL: time.Hour,
	}, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := capability.Grant{
		GrantID:      "g_1",
		HolderNodeID: "n_root",
		Issuer:       "operator:alice",
		Scopes:       []string{"tool:*", "s3:read:*"}, // exact duplicates dropped, order kept
		NotBefore:    t0,
		ExpiresAt:    t0.Add(time.Hour),
		Revokers:     []string{"operator:alice", "role:admin", "role:security"},
		State:        capability.StateActive,
		CreatedAt:    t0,
	}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("NewRoot =\n%+v\nwant\n%+v", g, want)
	}
}

func TestNewRootRefusesBadRequests(t *testing.T) {
	ok := capability.RootRequest{GrantID: "g_1", Issuer: "operator:alice", HolderNodeID: "n_1", Scopes: []string{"tool:*"}, TTL: time.Hour}
	tests := []struct {
		name   string
		change func(*capability.RootRequest)
		want   error
		field  string
	}{
		{"no grant id", func(r *capability.RootRequest) { r.GrantID = "" }, capability.ErrInvalidGrant, "grant_id"},
		{"grant id with space", func(r *capability.RootRequest) { r.GrantID = "g 1" }, capability.ErrInvalidGrant, "grant_id"},
		{"agent issuer", func(r *capability.RootRequest) { r.Issuer = "agent:n_0" }, capability.ErrInvalidGrant, "issuer"},
		{"bare operator", func(r *capability.RootRequest) { r.Issuer = "operator:" }, capability.ErrInvalidGrant, "issuer"},
		{"no holder", func(r *capability.RootRequest) { r.HolderNodeID = "" }, capability.ErrInvalidGrant, "holder_node_id"},
		{"long holder", func(r *capability.RootRequest) { r.HolderNodeID = strings.Repeat("n", 129) }, capability.ErrInvalidGrant, "holder_node_id"},
		{"no scopes", func(r *capability.RootRequest) { r.Scopes = nil }, capability.ErrInvalidScope, "scope"},
		{"bad scope", func(r *capability.RootRequest) { r.Scopes = []string{"tool:*:x"} }, capability.ErrInvalidScope, "tool:*:x"},
		{"too many scopes", func(r *capability.RootRequest) {
			r.Scopes = nil
			for i := range capability.MaxScopes + 1 {
				r.Scopes = append(r.Scopes, "tool:"+strings.Repeat("x", i+1))
			}
		}, capability.ErrInvalidScope, "exceed"},
		{"zero ttl", func(r *capability.RootRequest) { r.TTL = 0 }, capability.ErrInvalidTTL, "ttl"},
		{"negative ttl", func(r *capability.RootRequest) { r.TTL = -time.Second }, capability.ErrInvalidTTL, "ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := ok
			tt.change(&req)
			_, err := capability.NewRoot(req, t0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %q does not name %q", err, tt.field)
			}
		})
	}
}

func TestDelegateBuildsChainAndRevokers(t *testing.T) {
	tr := newGrantTree(t)
	g := tr.a1x
	if g.ParentGrantID != "g_a1" {
		t.Errorf("ParentGrantID = %q, want g_a1", g.ParentGrantID)
	}
	if want := []string{"g_root", "g_a", "g_a1"}; !slices.Equal(g.Chain, want) {
		t.Errorf("Chain = %v, want %v", g.Chain, want)
	}
	if g.Issuer != "agent:n_a1" {
		t.Errorf("Issuer = %q, want agent:n_a1", g.Issuer)
	}
	wantRevokers := []string{"agent:n_a", "agent:n_a1", "agent:n_root", "operator:alice", "role:admin", "role:security"}
	if !slices.Equal(g.Revokers, wantRevokers) {
		t.Errorf("Revokers = %v, want %v", g.Revokers, wantRevokers)
	}
	if slices.Contains(g.Revokers, "agent:n_a1x") {
		t.Error("the holder is in its own revoker set")
	}
	if !g.ExpiresAt.Equal(t0.Add(10 * time.Minute)) {
		t.Errorf("ExpiresAt = %v, want t0+10m", g.ExpiresAt)
	}
	// TTL 0 inherits the parent's expiry.
	if !tr.a1.ExpiresAt.Equal(tr.a.ExpiresAt) {
		t.Errorf("a1 ExpiresAt = %v, want parent's %v", tr.a1.ExpiresAt, tr.a.ExpiresAt)
	}
	if g.State != capability.StateActive || !g.NotBefore.Equal(t0) || !g.CreatedAt.Equal(t0) {
		t.Errorf("state/times = %v %v %v", g.State, g.NotBefore, g.CreatedAt)
	}
}

func TestDelegateEnforcesAttenuation(t *testing.T) {
	tr := newGrantTree(t)
	revokedA, err := capability.Revoke(tr.a, "operator:alice", nil, "incident", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	deep := tr.root
	for i := range capability.MaxChainDepth {
		deep.Chain = append(deep.Chain, "g_deep_"+strings.Repeat("x", i+1))
	}
	future := tr.root
	future.NotBefore = t0.Add(time.Hour)

	type req = capability.DelegateRequest
	tests := []struct {
		name    string
		parent  capability.Grant
		req     req
		holder  string // whose ancestors to pass; defaults to req.HolderNodeID
		now     time.Time
		want    error
		mention string
	}{
		{
			name:   "scope escalation names the scope",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell", "s3:read:logs"}},
			want: capability.ErrScopeEscalation, mention: `"s3:read:logs"`,
		},
		{
			name:   "wildcard broader than the parent's",
			parent: tr.a1, req: req{GrantID: "g_x", Issuer: "agent:n_a1", HolderNodeID: "n_a1x", Scopes: []string{"tool:*"}},
			want: capability.ErrScopeEscalation, mention: `"tool:*"`,
		},
		{
			name:   "expiry beyond the parent's",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}, TTL: 31 * time.Minute},
			want: capability.ErrExpiryExceedsParent, mention: "g_a",
		},
		{
			name:   "negative ttl",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}, TTL: -time.Minute},
			want: capability.ErrInvalidTTL, mention: "ttl",
		},
		{
			name:   "expired parent",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}},
			now:  t0.Add(30 * time.Minute),
			want: capability.ErrGrantExpired, mention: "g_a",
		},
		{
			name:   "revoked parent",
			parent: revokedA, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}},
			now:  t0.Add(2 * time.Minute),
			want: capability.ErrGrantRevoked, mention: "g_a",
		},
		{
			name:   "parent not yet valid",
			parent: future, req: req{GrantID: "g_x", Issuer: "agent:n_root", HolderNodeID: "n_a", Scopes: []string{"tool:shell"}},
			want: capability.ErrGrantNotYetValid, mention: "g_root",
		},
		{
			name:   "sibling of the delegator",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_b", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotInSubtree, mention: "n_b",
		},
		{
			name:   "ancestor of the delegator",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_root", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotInSubtree, mention: "n_root",
		},
		{
			name:   "the delegator itself",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotInSubtree, mention: "n_a",
		},
		{
			name:   "unregistered node with no ancestors",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_ghost", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotInSubtree, mention: "n_ghost",
		},
		{
			name:   "issuer does not hold the parent",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_root", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotHolder, mention: "g_a",
		},
		{
			name:   "operator cannot delegate from an agent's grant",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "operator:alice", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}},
			want: capability.ErrNotHolder, mention: "g_a",
		},
		{
			name:   "grant id already in the chain",
			parent: tr.a, req: req{GrantID: "g_root", Issuer: "agent:n_a", HolderNodeID: "n_a1", Scopes: []string{"tool:shell"}},
			want: capability.ErrInvalidGrant, mention: "g_root",
		},
		{
			name:   "chain too deep",
			parent: deep, req: req{GrantID: "g_x", Issuer: "agent:n_root", HolderNodeID: "n_a", Scopes: []string{"tool:shell"}},
			want: capability.ErrChainTooDeep, mention: "g_root",
		},
		{
			name:   "no scopes",
			parent: tr.a, req: req{GrantID: "g_x", Issuer: "agent:n_a", HolderNodeID: "n_a1"},
			want: capability.ErrInvalidScope, mention: "scope",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := tt.now
			if now.IsZero() {
				now = t0
			}
			holder := tt.holder
			if holder == "" {
				holder = tt.req.HolderNodeID
			}
			g, err := capability.Delegate(tt.parent, tt.req, agentTree[holder], now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %q does not mention %s", err, tt.mention)
			}
			if !reflect.DeepEqual(g, capability.Grant{}) {
				t.Fatalf("a refused delegation returned a grant: %+v", g)
			}
		})
	}
}

func TestCanRevoke(t *testing.T) {
	tr := newGrantTree(t)
	g := tr.a1 // held by n_a1, chain g_root (n_root) → g_a (n_a)
	tests := []struct {
		name      string
		principal string
		roles     []string
		want      bool
	}{
		{"root's issuing operator", "operator:alice", nil, true},
		{"issuer (parent's holder)", "agent:n_a", nil, true},
		{"every ancestor holder", "agent:n_root", nil, true},
		{"security role", "operator:bob", []string{"role:security"}, true},
		{"admin role", "operator:carol", []string{"role:viewer", "role:admin"}, true},
		{"the holder itself", "agent:n_a1", nil, false},
		{"the holder even with a role", "agent:n_a1", []string{"role:admin"}, false},
		{"sibling", "agent:n_a2", nil, false},
		{"descendant", "agent:n_a1x", nil, false},
		{"unrelated agent", "agent:n_b", nil, false},
		{"unrelated operator", "operator:bob", nil, false},
		{"unknown role", "operator:bob", []string{"role:viewer"}, false},
		{"principal smuggled as a role", "agent:n_b", []string{"agent:n_a", "operator:alice"}, false},
		{"bare role prefix", "agent:n_b", []string{"role:"}, false},
		{"a principal spelled as a role", "role:admin", nil, false},
		{"anonymous", "", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := capability.CanRevoke(g, tt.principal, tt.roles); got != tt.want {
				t.Fatalf("CanRevoke(%q, %v) = %v, want %v", tt.principal, tt.roles, got, tt.want)
			}
		})
	}
}

func TestRevokeTransition(t *testing.T) {
	tr := newGrantTree(t)
	at := t0.Add(5 * time.Minute)

	revoked, err := capability.Revoke(tr.a1, "agent:n_root", nil, "runaway loop", at)
	if err != nil {
		t.Fatal(err)
	}
	if revoked.State != capability.StateRevoked || revoked.RevokedBy != "agent:n_root" ||
		!revoked.RevokedAt.Equal(at) || revoked.RevokedVia != "g_a1" || revoked.Reason != "runaway loop" {
		t.Fatalf("revoked grant = %+v", revoked)
	}

	if _, err := capability.Revoke(revoked, "agent:n_root", nil, "again", at); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("second revoke: err = %v, want ErrGrantRevoked", err)
	}

	got, err := capability.Revoke(tr.a1, "agent:n_a1", nil, "", at)
	if !errors.Is(err, capability.ErrNotRevoker) || !strings.Contains(err.Error(), `"agent:n_a1"`) {
		t.Fatalf("holder revoking itself: err = %v, want ErrNotRevoker naming the principal", err)
	}
	if !reflect.DeepEqual(got, tr.a1) {
		t.Fatal("a refused revoke changed the grant")
	}

	if _, err := capability.Revoke(tr.a1, "agent:\x1b[2J", nil, "", at); err == nil || strings.ContainsRune(err.Error(), 0x1b) {
		t.Fatalf("malformed principal must be refused without echoing control bytes: %v", err)
	}

	if _, err := capability.Revoke(tr.a1, "operator:alice", nil, "", tr.a1.ExpiresAt); !errors.Is(err, capability.ErrGrantExpired) {
		t.Fatalf("revoke at expiry: err = %v, want ErrGrantExpired", err)
	}

	if _, err := capability.Revoke(tr.a1, "operator:alice", nil, strings.Repeat("x", capability.MaxReasonBytes+1), at); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("long reason: err = %v, want ErrInvalidGrant", err)
	}
	if _, err := capability.Revoke(tr.a1, "operator:alice", nil, "\xff", at); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("invalid UTF-8 reason: err = %v, want ErrInvalidGrant", err)
	}
}

func TestMarkRevokedVia(t *testing.T) {
	tr := newGrantTree(t)
	at := t0.Add(5 * time.Minute)
	revokedA, err := capability.Revoke(tr.a, "operator:alice", []string{"role:security"}, "incident 42", at)
	if err != nil {
		t.Fatal(err)
	}

	a1, err := capability.MarkRevokedVia(tr.a1, revokedA)
	if err != nil {
		t.Fatal(err)
	}
	if a1.State != capability.StateRevoked || a1.RevokedVia != "g_a" || !a1.RevokedAt.Equal(at) ||
		a1.RevokedBy != "operator:alice" || a1.Reason != "incident 42" {
		t.Fatalf("marked grant = %+v", a1)
	}

	// Marking through an already-marked intermediate keeps the original cause.
	a1x, err := capability.MarkRevokedVia(tr.a1x, a1)
	if err != nil {
		t.Fatal(err)
	}
	if a1x.RevokedVia != "g_a" {
		t.Fatalf("RevokedVia = %q, want g_a", a1x.RevokedVia)
	}

	// Marking is level-triggered: a grant stored as expired after the
	// revocation still records the revocation, which came first.
	expiredLater, err := capability.Expire(tr.a1x, tr.a1x.ExpiresAt)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := capability.MarkRevokedVia(expiredLater, revokedA); err != nil || got.State != capability.StateRevoked {
		t.Fatalf("late marking of a grant that expired after the revocation = %v, %v", got.State, err)
	}

	// A grant that expired before the revocation stays expired.
	short := mustDelegate(t, tr.a, "g_short", "n_a2", []string{"tool:fs:x"}, time.Minute, t0)
	if _, err := capability.MarkRevokedVia(short, revokedA); !errors.Is(err, capability.ErrGrantExpired) {
		t.Fatalf("grant expired before revocation: err = %v, want ErrGrantExpired", err)
	}

	if _, err := capability.MarkRevokedVia(a1, revokedA); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("marking twice: err = %v, want ErrGrantRevoked", err)
	}
	if _, err := capability.MarkRevokedVia(tr.b, revokedA); !errors.Is(err, capability.ErrChainBroken) {
		t.Fatalf("marking outside the subtree: err = %v, want ErrChainBroken", err)
	}
	if _, err := capability.MarkRevokedVia(tr.a1, tr.a); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("marking via an active grant: err = %v, want ErrInvalidGrant", err)
	}
}

func TestExpireTransition(t *testing.T) {
	tr := newGrantTree(t)
	if _, err := capability.Expire(tr.a1, tr.a1.ExpiresAt.Add(-time.Nanosecond)); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("early expire: err = %v, want ErrInvalidGrant", err)
	}
	expired, err := capability.Expire(tr.a1, tr.a1.ExpiresAt)
	if err != nil || expired.State != capability.StateExpired {
		t.Fatalf("Expire at ExpiresAt = %v, %v", expired.State, err)
	}
	if _, err := capability.Expire(expired, tr.a1.ExpiresAt.Add(time.Hour)); !errors.Is(err, capability.ErrGrantExpired) {
		t.Fatalf("expire twice: err = %v, want ErrGrantExpired", err)
	}
	if _, err := capability.Revoke(expired, "operator:alice", nil, "", tr.a1.ExpiresAt.Add(time.Hour)); !errors.Is(err, capability.ErrGrantExpired) {
		t.Fatalf("revoke after expiry: err = %v, want ErrGrantExpired", err)
	}
	revoked, err := capability.Revoke(tr.a1, "operator:alice", nil, "", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capability.Expire(revoked, tr.a1.ExpiresAt); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("expire a revoked grant: err = %v, want ErrGrantRevoked", err)
	}
	if (capability.Grant{GrantID: "g_0"}).CheckActive(t0) == nil {
		t.Fatal("a grant with no state is active")
	}
}

func TestStateAtAndCheckActive(t *testing.T) {
	tr := newGrantTree(t)
	g := tr.a1
	if s := g.StateAt(g.ExpiresAt.Add(-time.Nanosecond)); s != capability.StateActive {
		t.Fatalf("just before expiry: %v", s)
	}
	if s := g.StateAt(g.ExpiresAt); s != capability.StateExpired {
		t.Fatalf("at expiry: %v", s)
	}
	err := g.CheckActive(g.ExpiresAt)
	if !errors.Is(err, capability.ErrGrantExpired) || !strings.Contains(err.Error(), "g_a1") {
		t.Fatalf("CheckActive at expiry = %v", err)
	}
}

func TestStateNamesAndJSON(t *testing.T) {
	names := map[capability.State]string{
		capability.StateUnspecified: "unspecified",
		capability.StateActive:      "active",
		capability.StateRevoked:     "revoked",
		capability.StateExpired:     "expired",
		capability.State(9):         "unspecified",
	}
	for s, want := range names {
		if s.String() != want {
			t.Errorf("State(%d).String() = %q, want %q", s, s.String(), want)
		}
	}
	tr := newGrantTree(t)
	revoked, err := capability.Revoke(tr.a1x, "agent:n_a", nil, "done", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(revoked)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(`"state":"revoked"`)) || !bytes.Contains(data, []byte(`"holder_node_id":"n_a1x"`)) {
		t.Fatalf("JSON = %s", data)
	}
	var back capability.Grant
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, revoked) {
		t.Fatalf("round trip:\n%+v\n%+v", back, revoked)
	}
	if err := json.Unmarshal([]byte(`{"state":"zombie"}`), &back); !errors.Is(err, capability.ErrInvalidGrant) {
		t.Fatalf("unknown state: err = %v", err)
	}
}

func TestNewGrantID(t *testing.T) {
	a, err := capability.NewGrantID(bytes.NewReader(make([]byte, 16)))
	if err != nil {
		t.Fatal(err)
	}
	if a != "g_aaaaaaaaaaaaaaaaaaaaaaaaaa" {
		t.Fatalf("NewGrantID(zeros) = %q", a)
	}
	b, err := capability.NewGrantID(nil)
	if err != nil || capability.ValidateID("grant_id", b) != nil || b == a {
		t.Fatalf("NewGrantID(crypto) = %q, %v", b, err)
	}
	if _, err := capability.NewGrantID(bytes.NewReader(make([]byte, 3))); err == nil {
		t.Fatal("short random source accepted")
	}
}
