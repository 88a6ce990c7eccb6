package auth

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// TestRogue32EDeadCredentialsFirstReadsInFlightAtOnceCostNoMoreThanTheirBudget:
// a rogue holding many dead credentials (its own terminated children's,
// each a real token that verifies) sends each once, all at once, from one
// address. A credential seen for the first time was paid for before its
// verification and given its payment back as soon as it verified, before
// its node was read; the node read found it dead and charged the address
// after the read. So every dead credential in flight at once was read
// while the others were: with a budget of one, all of them. The payment is
// now kept until the node is found live.
func TestRogue32EDeadCredentialsFirstReadsInFlightAtOnceCostNoMoreThanTheirBudget(t *testing.T) {
	fx := newCacheFixture(t)
	now := fuzzT0.Add(time.Minute)
	clock := func() time.Time { return now }
	const n = 16
	dead := make([]string, n)
	for k := range dead {
		tok, _, err := fx.issuer.MintAgent(fmt.Sprintf("n_dead%d", k), fuzzT0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		dead[k] = tok
	}
	live, _, err := fx.issuer.MintAgent("n_live", fuzzT0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	entered := make(chan struct{}, n+1)
	release := make(chan struct{})
	const procedure = "/tether.v1.AgentService/GetNode"
	i := &Interceptor{
		Issuer: fx.issuer,
		Now:    clock,
		Policy: Policy{procedure: Rule{Agents: true}},
		Cache:  NewTokenCache(0),
		AgentActive: func(ctx context.Context, nodeID string) (string, error) {
			reads.Add(1)
			entered <- struct{}{}
			<-release
			if nodeID == "n_live" {
				return "n_live", nil
			}
			return "", fmt.Errorf("%w: node %s was terminated", ErrRevoked, nodeID)
		},
		Anonymous: &RateLimiter{Rate: 1, Burst: 1, Now: clock},
	}
	const peer = "198.51.100.7:40000"
	call := func(tok string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + tok}}, peer)
			done <- err
		}()
		return done
	}
	guard := time.After(20 * time.Second) // a guard against a hang, not a timing

	first := call(dead[0])
	select {
	case <-entered:
	case err := <-first:
		t.Fatalf("the first dead credential was refused before its node was read: %v", err)
	case <-guard:
		t.Fatal("the first dead credential's node was never read")
	}
	var others []<-chan error
	for k := 1; k < n; k++ {
		done := call(dead[k])
		select {
		case <-entered: // read while the first one is: the budget did not hold it back
			others = append(others, done)
		case err := <-done:
			if connect.CodeOf(err) != connect.CodeResourceExhausted {
				t.Errorf("dead credential %d while the address's budget is spent: %v (%s), want resource_exhausted", k, err, connect.CodeOf(err))
			}
		case <-guard:
			t.Fatalf("dead credential %d neither refused nor read", k)
		}
	}
	close(release)
	if err := <-first; connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("the first dead credential: %v (%s), want unauthenticated", err, connect.CodeOf(err))
	}
	for _, done := range others {
		<-done
	}
	if got := reads.Load(); got > 1 {
		t.Errorf("%d dead credentials sent at once from one address had %d node reads with a budget of 1", n, got)
	}

	// A second later: a live credential's read is paid for and given
	// back once its node is found live; a dead one after it still finds
	// the budget's one request.
	now = now.Add(time.Second)
	if _, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + live}}, peer); err != nil {
		t.Fatalf("a live credential from the address: %v", err)
	}
	if _, err := i.authenticate(context.Background(), procedure, http.Header{"Authorization": {"Bearer " + dead[1]}}, peer); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("a dead credential after a live one: %v (%s), want unauthenticated (the live one's payment given back)", err, connect.CodeOf(err))
	}
}
