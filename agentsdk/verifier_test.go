package agentsdk

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/clock"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// keyServer serves a key ring as JWKS, as the control plane does, and
// counts the fetches.
type keyServer struct {
	mu      sync.Mutex
	ring    capability.KeyRing
	fetches atomic.Int32
	url     string
	client  *http.Client
}

func newKeyServer(t testing.TB, ring capability.KeyRing) *keyServer {
	t.Helper()
	k := &keyServer{ring: ring}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != JWKSPath {
			http.NotFound(w, r)
			return
		}
		k.fetches.Add(1)
		k.mu.Lock()
		body, err := k.ring.JWKS()
		k.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	k.url, k.client = srv.URL, srv.Client()
	return k
}

func (k *keyServer) serve(ring capability.KeyRing) {
	k.mu.Lock()
	k.ring = ring
	k.mu.Unlock()
}

func newRing(t testing.TB) capability.KeyRing {
	t.Helper()
	key, err := capability.NewSigningKey(nil, t0, t0)
	if err != nil {
		t.Fatal(err)
	}
	return capability.KeyRing{Keys: []capability.SigningKey{key}}
}

// grantLine is a root grant and a grant delegated from it.
func grantLine(t testing.TB, rootID, childID string) (root, child capability.Grant) {
	t.Helper()
	root, err := capability.NewRoot(capability.RootRequest{GrantID: rootID, Issuer: "operator:alice", HolderNodeID: "n_root", Scopes: []string{"tool:*"}, TTL: time.Hour}, t0)
	if err != nil {
		t.Fatal(err)
	}
	child, err = capability.Delegate(root, capability.DelegateRequest{GrantID: childID, Issuer: "agent:n_root", HolderNodeID: "n_child", Scopes: []string{"tool:shell"}}, []string{"n_root"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	return root, child
}

func mint(t testing.TB, ring capability.KeyRing, g capability.Grant, now time.Time) string {
	t.Helper()
	m, err := capability.NewMinter("tether", Audience)
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := m.Mint(ring, g, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func newTestVerifier(t *testing.T, keys *keyServer, clk Clock) *Verifier {
	t.Helper()
	v, err := NewVerifier(VerifierConfig{Conn: Dial(keys.url, "", WithHTTPClient(keys.client)), Clock: clk, StalenessBudget: 10 * time.Second, JWKSMinInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tombstone(seq uint64, grantID string) *tetherv1.Tombstone {
	return &tetherv1.Tombstone{Sequence: seq, GrantId: grantID, RevokedAt: timestamppb.New(t0), DropAfter: timestamppb.New(capability.DropAfter(t0))}
}

func apply(t *testing.T, v *Verifier, msg *tetherv1.WatchRevocationsResponse) {
	t.Helper()
	if err := v.apply(msg); err != nil {
		t.Fatal(err)
	}
}

// A cached token skips only the signature: the tombstones and exp are
// checked on every use.
func TestVerifierCacheHitStillConsultsTombstones(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	ring := newRing(t)
	keys := newKeyServer(t, ring)
	v := newTestVerifier(t, keys, clk)
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	root, child := grantLine(t, "g_root", "g_child")
	token := mint(t, ring, child, t0)

	if _, err := v.Verify(ctx, token); err != nil {
		t.Fatal(err)
	}
	// Take the keys away, here and at the source: only a cache hit can
	// still accept the token.
	keys.serve(capability.KeyRing{})
	v.jwks.ring.Store(&capability.KeyRing{})
	fetches := keys.fetches.Load()
	claims, err := v.Verify(ctx, token)
	if err != nil || claims.GrantID != child.GrantID {
		t.Fatalf("second use: %v %v, want a cache hit", claims, err)
	}
	if keys.fetches.Load() != fetches {
		t.Fatal("the second use fetched keys: it was not served from the cache")
	}

	apply(t, v, &tetherv1.WatchRevocationsResponse{Tombstones: []*tetherv1.Tombstone{tombstone(1, root.GrantID)}, HeadSequence: 1})
	_, err = v.Verify(ctx, token)
	if !errors.Is(err, capability.ErrGrantRevoked) || !strings.Contains(err.Error(), "via ancestor grant "+root.GrantID) {
		t.Fatalf("a cached token under a revoked root: %v", err)
	}

	// exp is checked on cached claims too, without leeway.
	clk.Set(t0)
	_, live := grantLine(t, "g_root2", "g_child2")
	keys.serve(ring)
	v.jwks.ring.Store(&ring)
	liveToken := mint(t, ring, live, t0)
	if _, err := v.Verify(ctx, liveToken); err != nil {
		t.Fatal(err)
	}
	v.jwks.ring.Store(&capability.KeyRing{})
	clk.Advance(capability.DefaultTokenTTL)
	apply(t, v, &tetherv1.WatchRevocationsResponse{HeadSequence: 1}) // a heartbeat: still fresh
	if _, err := v.Verify(ctx, liveToken); !errors.Is(err, capability.ErrTokenExpired) {
		t.Fatalf("a cached token at its exp: %v", err)
	}
}

// A snapshot makes the set exactly what it carries, at its head, even a
// head below the one the verifier had (the feed it followed was replaced).
func TestVerifierSnapshotReplacesTheSet(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	ring := newRing(t)
	v := newTestVerifier(t, newKeyServer(t, ring), clk)
	if err := v.jwks.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{Tombstones: []*tetherv1.Tombstone{tombstone(1, "g_x"), tombstone(2, "g_y")}, HeadSequence: 2})
	if v.Head() != 2 || v.tombstones.Len() != 2 {
		t.Fatalf("after two tombstones: head %d, %d held", v.Head(), v.tombstones.Len())
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{Tombstones: []*tetherv1.Tombstone{tombstone(7, "g_z")}, HeadSequence: 7, Snapshot: true})
	if v.Head() != 7 || v.tombstones.Len() != 1 {
		t.Fatalf("after a snapshot of one at 7: head %d, %d held", v.Head(), v.tombstones.Len())
	}
	for id, want := range map[string]bool{"g_x": false, "g_y": false, "g_z": true} {
		if _, ok := v.tombstones.Lookup(id); ok != want {
			t.Errorf("after the snapshot, %s held = %v, want %v", id, ok, want)
		}
	}
	_, under := grantLine(t, "g_z", "g_under_z")
	if _, err := v.Verify(ctx, mint(t, ring, under, t0)); !errors.Is(err, capability.ErrGrantRevoked) {
		t.Fatalf("a token under a snapshot tombstone: %v", err)
	}
	// A later snapshot from a shorter history moves the head back, so the
	// verifier resumes from the new feed's position.
	apply(t, v, &tetherv1.WatchRevocationsResponse{Tombstones: []*tetherv1.Tombstone{tombstone(3, "g_w")}, HeadSequence: 3, Snapshot: true})
	if v.Head() != 3 {
		t.Fatalf("head after a snapshot at 3: %d", v.Head())
	}
}

// An unknown kid refetches the key set, at most once per interval however
// many tokens name one, and concurrent misses share one fetch.
func TestVerifierRefreshesTheKeySetOnAnUnknownKid(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	ring := newRing(t)
	keys := newKeyServer(t, ring)
	v := newTestVerifier(t, keys, clk)
	if err := v.jwks.refresh(ctx); err != nil { // what Run does first
		t.Fatal(err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	_, child := grantLine(t, "g_root", "g_child")

	// The control plane rotates: a key the verifier has not seen signs.
	rotated, _, err := ring.Rotate(nil, clk.Now(), 0, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	keys.serve(rotated)
	fetches := keys.fetches.Load()
	if _, err := v.Verify(ctx, mint(t, rotated, child, clk.Now())); err != nil {
		t.Fatalf("a token signed by a newly published key: %v", err)
	}
	if got := keys.fetches.Load() - fetches; got != 1 {
		t.Fatalf("%d fetches for one unknown kid, want 1", got)
	}

	// Made-up kids do not turn into a flood of fetches.
	_, stranger, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": "tether", "aud": Audience, "sub": "n_child", "jti": "g_child", "exp": t0.Add(time.Minute).Unix()})
	forged.Header["kid"] = "made-up"
	forgedToken, err := forged.SignedString(stranger)
	if err != nil {
		t.Fatal(err)
	}
	fetches = keys.fetches.Load()
	for range 100 {
		_, err := v.Verify(ctx, forgedToken)
		if !errors.Is(err, capability.ErrUnknownKey) {
			t.Fatalf("a forged kid: %v", err)
		}
		if strings.Contains(err.Error(), forgedToken[:20]) {
			t.Fatal("the error quotes the token")
		}
	}
	if got := keys.fetches.Load() - fetches; got != 0 {
		t.Fatalf("%d fetches for forged kids within the interval after a fetch, want 0", got)
	}
	clk.Advance(time.Minute)
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	for range 100 {
		_, _ = v.Verify(ctx, forgedToken)
	}
	if got := keys.fetches.Load() - fetches; got != 1 {
		t.Fatalf("%d fetches for forged kids once the interval passed, want 1", got)
	}

	// Many calls miss the same new kid at once: one fetch, and every call
	// uses its result.
	rotatedAgain, _, err := rotated.Rotate(nil, clk.Now(), 0, capability.MaxTokenTTL)
	if err != nil {
		t.Fatal(err)
	}
	keys.serve(rotatedAgain)
	clk.Advance(time.Minute)
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	fetches = keys.fetches.Load()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		_, g := grantLine(t, "g_root", "g_conc_"+string(rune('a'+i)))
		token := mint(t, rotatedAgain, g, clk.Now())
		wg.Go(func() {
			if _, err := v.Verify(ctx, token); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a concurrent miss: %v", err)
	}
	if got := keys.fetches.Load() - fetches; got != 1 {
		t.Fatalf("%d fetches for 16 concurrent misses of one kid, want 1", got)
	}
}

// Freshness is the verifier's own clock since the last feed message.
func TestVerifierFailsClosedWithoutAFreshFeed(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	ring := newRing(t)
	v := newTestVerifier(t, newKeyServer(t, ring), clk)
	if err := v.jwks.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	_, child := grantLine(t, "g_root", "g_child")
	token := mint(t, ring, child, t0)
	if _, err := v.Verify(ctx, token); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("before any feed message: %v", err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{})
	if _, err := v.Verify(ctx, token); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10*time.Second + time.Nanosecond)
	if _, err := v.Verify(ctx, token); !errors.Is(err, capability.ErrFeedStale) {
		t.Fatalf("past the budget: %v", err)
	}
	apply(t, v, &tetherv1.WatchRevocationsResponse{}) // a heartbeat
	if _, err := v.Verify(ctx, token); err != nil {
		t.Fatalf("after a heartbeat: %v", err)
	}
}
