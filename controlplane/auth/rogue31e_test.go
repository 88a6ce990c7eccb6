package auth

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/capability"
)

// TestRogue31EForgedTokensInFlightAtOnceCostNoMoreVerificationsThanTheirBudget:
// an attacker without a credential sends real-looking tokens with forged
// signatures — each a full Ed25519 verification — many at once from one
// address (eight a connection before it authenticates, on as many
// connections as it likes). The address's budget for requests without a
// valid credential was only looked at before each verification and
// charged after it, so every request that arrived while the others were
// being verified found the budget unspent: with a budget of one, all of
// them were verified. Each verification is now paid for before it is
// made, so those in flight at once are at most the budget; a credential
// that verifies and is live is given its payment back.
func TestRogue31EForgedTokensInFlightAtOnceCostNoMoreVerificationsThanTheirBudget(t *testing.T) {
	fx := newCacheFixture(t)
	now := fuzzT0.Add(time.Minute)
	clock := func() time.Time { return now }
	const n = 16
	forged := make([]string, n)
	for k := range forged {
		tok, _, err := fx.issuer.MintAgent(fmt.Sprintf("n_%d", k), fuzzT0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		// One character of the signature changed for another of the
		// alphabet: well formed, and verified in full to be refused.
		b := []byte(tok)
		if b[len(b)-3] == 'A' {
			b[len(b)-3] = 'B'
		} else {
			b[len(b)-3] = 'A'
		}
		forged[k] = string(b)
	}
	honest, _, err := fx.issuer.MintAgent("n_honest", fuzzT0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	// The ring is read once per verification; it holds each one until
	// released, so that the test sees how many are in flight at once.
	var verifications atomic.Int64
	entered := make(chan struct{}, n)
	release := make(chan struct{})
	issuer := Issuer{Name: fx.issuer.Name, Ring: func() capability.KeyRing {
		verifications.Add(1)
		entered <- struct{}{}
		<-release
		return fx.issuer.Ring()
	}}
	const procedure = "/tether.v1.AgentService/GetNode"
	i := &Interceptor{
		Issuer:    issuer,
		Now:       clock,
		Policy:    Policy{procedure: Rule{Agents: true}},
		Cache:     NewTokenCache(0),
		Anonymous: &RateLimiter{Rate: 1, Burst: 1, Now: clock},
	}
	const peer = "198.51.100.7:40000"
	call := func(tok string) <-chan error {
		done := make(chan error, 1)
		go func() {
			h := http.Header{}
			h.Set("Authorization", "Bearer "+tok)
			_, err := i.authenticate(context.Background(), procedure, h, peer)
			done <- err
		}()
		return done
	}
	guard := time.After(20 * time.Second) // a guard against a hang, not a timing

	first := call(forged[0])
	select {
	case <-entered:
	case err := <-first:
		t.Fatalf("the first forged token was refused unverified: %v", err)
	case <-guard:
		t.Fatal("the first forged token was never verified")
	}
	var others []<-chan error
	for k := 1; k < n; k++ {
		done := call(forged[k])
		select {
		case <-entered: // verified while the first one is: the budget did not hold it back
			others = append(others, done)
		case err := <-done:
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Errorf("forged token %d while the address's budget is spent: %v (%s), want resource_exhausted", k, err, connect.CodeOf(err))
			}
		case <-guard:
			t.Fatalf("forged token %d neither refused nor verified", k)
		}
	}
	close(release)
	if err := <-first; connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("the first forged token: %v (%s), want unauthenticated", err, connect.CodeOf(err))
	}
	for _, done := range others {
		<-done
	}
	if got := verifications.Load(); got > 1 {
		t.Errorf("%d forged tokens sent at once from one address were verified with a budget of 1: %d verifications", n, got)
	}

	// A second later the budget holds one request again. A live
	// credential's verification is paid for and given back: the forged
	// token after it still finds the budget's one request.
	now = now.Add(time.Second)
	if _, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + honest}}, peer); err != nil {
		t.Fatalf("a live credential from the address: %v", err)
	}
	if _, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + forged[1]}}, peer); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a forged token after a live credential: %v (%s), want unauthenticated (the live one's payment given back)", err, connect.CodeOf(err))
	}
	if _, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + forged[2]}}, peer); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a second forged token: %v (%s), want resource_exhausted", err, connect.CodeOf(err))
	}
}
