package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tetherhq/tether/internal/clock"
)

// Etcd elects one leader among the replicas that share an etcd cluster
// and a Prefix. The zero value is not usable: set Client and Prefix.
type Etcd struct {
	// Client connects to the cluster; the elector does not close it.
	Client *clientv3.Client
	// Prefix is the election's key prefix, the same for every replica of
	// one control plane: etcdstore.Etcd.MetadataPrefix("leader").
	Prefix string
	// Identity names this replica in the election (Leader reports it).
	// Default: host name and process id.
	Identity string
	// Address is how the other replicas reach this one (its advertised
	// URL, e.g. http://10.0.0.7:7420). It is published with Identity in
	// the election value, so that replicas can forward to the leader what
	// only the leader serves (Observe). Empty: not reachable.
	Address string
	// TTL is the session lease's time to live: how long the replicas wait
	// for a leader that died without resigning before electing another.
	// Default 10s. etcd rounds it up to its own minimum (a few seconds).
	TTL time.Duration
	// Log receives leadership changes. Nil means slog.Default().
	Log *slog.Logger
}

const (
	defaultTTL = 10 * time.Second
	// resignTimeout bounds resigning and revoking the session when a term
	// ends; past it the lease expires by itself after TTL.
	resignTimeout = 5 * time.Second
	// Campaigns after a failure or a lost term wait a jittered backoff
	// growing from campaignBackoffBase to campaignBackoffMax.
	campaignBackoffBase = 100 * time.Millisecond
	campaignBackoffMax  = 5 * time.Second
)

// Reasons a term ends, reported as its context's cause.
var (
	ErrSessionExpired = errors.New("leader: the session lease expired or could not be renewed")
	ErrKeyDeleted     = errors.New("leader: the election key was deleted")
	ErrWatchEnded     = errors.New("leader: lost sight of the election key (etcd member without a leader, or unreachable)")
	// ErrNoLeader is returned by Leader when no replica leads.
	ErrNoLeader = errors.New("leader: no replica leads")
)

func (e *Etcd) withDefaults() (Etcd, error) {
	c := *e
	if c.Client == nil || c.Prefix == "" {
		return c, errors.New("leader: an etcd elector needs a Client and a Prefix")
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if c.TTL <= 0 {
		c.TTL = defaultTTL
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c, nil
}

// Lead campaigns, runs fn while this replica leads, and campaigns again
// after losing leadership, until ctx ends. When ctx ends it resigns, so
// that another replica takes over at once instead of after the TTL.
func (e *Etcd) Lead(ctx context.Context, fn func(ctx context.Context) error) error {
	cfg, err := e.withDefaults()
	if err != nil {
		return err
	}
	failures := 0
	for ctx.Err() == nil {
		over, fnErr, err := cfg.term(ctx, fn)
		if over {
			return fnErr
		}
		if ctx.Err() != nil {
			break
		}
		failures++
		cfg.Log.Warn("not leading; campaigning again", "identity", cfg.Identity, "reason", err)
		if err := backoff(ctx, failures); err != nil {
			break
		}
	}
	return nil
}

// term runs one session: campaign, lead, resign. over reports that fn
// returned while this replica still led, with fnErr; otherwise err says why
// the term ended or never began.
func (e *Etcd) term(ctx context.Context, fn func(ctx context.Context) error) (over bool, fnErr, err error) {
	ttl := int64(max(1, (e.TTL+time.Second-1)/time.Second))
	grant, err := e.Client.Grant(ctx, ttl)
	if err != nil {
		return false, nil, fmt.Errorf("grant a session lease: %w", err)
	}
	// The session outlives ctx by design: after ctx ends it still has to
	// resign and revoke its lease.
	sessionCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	defer endSession()
	session, err := concurrency.NewSession(e.Client,
		concurrency.WithLease(grant.ID), concurrency.WithTTL(int(ttl)), concurrency.WithContext(sessionCtx))
	if err != nil {
		revokeCtx, cancel := context.WithTimeout(sessionCtx, resignTimeout)
		_, _ = e.Client.Revoke(revokeCtx, grant.ID)
		cancel()
		return false, nil, fmt.Errorf("start a session: %w", err)
	}
	defer func() {
		// Close revokes the lease, which deletes our election key if it
		// is still there; bounded by the TTL.
		if err := session.Close(); err != nil && ctx.Err() == nil {
			e.Log.Debug("closing the election session", "error", err)
		}
	}()

	election := concurrency.NewElection(session, e.Prefix)
	campaignCtx, stopCampaign := context.WithCancel(ctx)
	stop := context.AfterFunc(session.Ctx(), stopCampaign)
	err = election.Campaign(campaignCtx, encodeCandidate(Candidate{Identity: e.Identity, Address: e.Address}))
	stop()
	stopCampaign()
	if err != nil {
		if ctx.Err() == nil && session.Ctx().Err() != nil {
			err = ErrSessionExpired
		}
		return false, nil, fmt.Errorf("campaign: %w", err)
	}

	// Campaign returns when every earlier candidate is gone, even if our
	// own key went meanwhile with an expired session: check that the key
	// is still ours before leading.
	resp, err := e.Client.Get(ctx, election.Key())
	if err != nil {
		return false, nil, fmt.Errorf("check the election key: %w", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != election.Rev() || clientv3.LeaseID(resp.Kvs[0].Lease) != session.Lease() {
		return false, nil, ErrKeyDeleted
	}

	termCtx, endTerm := context.WithCancelCause(ctx)
	defer endTerm(nil)
	// Watch our key from just after the check: its deletion is the loss of
	// leadership etcd tells everyone else about. WithRequireLeader ends the
	// watch when our etcd member loses its own leader, when we can no
	// longer learn anything.
	watch := e.Client.Watch(clientv3.WithRequireLeader(termCtx), election.Key(), clientv3.WithRev(resp.Header.Revision+1))
	monitored := make(chan struct{})
	go func() {
		defer close(monitored)
		endTerm(monitorTerm(termCtx, session, watch))
	}()

	e.Log.Info("leading", "identity", e.Identity, "election_key", election.Key())
	fnErr = fn(termCtx)
	lost := context.Cause(termCtx)
	endTerm(nil)
	<-monitored

	resignCtx, cancel := context.WithTimeout(sessionCtx, resignTimeout)
	if err := election.Resign(resignCtx); err != nil {
		e.Log.Debug("resigning", "error", err)
	}
	cancel()

	switch {
	case ctx.Err() != nil:
		e.Log.Info("stopped leading: shutting down", "identity", e.Identity)
		return false, nil, ctx.Err()
	case lost != nil:
		e.Log.Warn("lost leadership", "identity", e.Identity, "reason", lost)
		return false, nil, lost
	}
	return true, fnErr, nil
}

// monitorTerm waits until the term must end and says why: nil when the
// term's context ended first.
func monitorTerm(ctx context.Context, session *concurrency.Session, watch clientv3.WatchChan) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-session.Done():
			return ErrSessionExpired
		case resp, ok := <-watch:
			if ctx.Err() != nil {
				return nil
			}
			if !ok {
				return ErrWatchEnded
			}
			if err := resp.Err(); err != nil {
				return fmt.Errorf("%w: %v", ErrWatchEnded, err)
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return ErrKeyDeleted
				}
			}
		}
	}
}

// Leader returns the identity of the replica that leads now, or
// ErrNoLeader.
func (e *Etcd) Leader(ctx context.Context) (string, error) {
	c, err := e.Current(ctx)
	return c.Identity, err
}

// Current returns the replica that leads now, or ErrNoLeader.
func (e *Etcd) Current(ctx context.Context) (Candidate, error) {
	if e.Client == nil || e.Prefix == "" {
		return Candidate{}, errors.New("leader: an etcd elector needs a Client and a Prefix")
	}
	// The oldest candidate's key is the leader's (as in concurrency.Election).
	resp, err := e.Client.Get(ctx, e.Prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return Candidate{}, fmt.Errorf("leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Candidate{}, ErrNoLeader
	}
	return decodeCandidate(resp.Kvs[0].Value), nil
}

// backoff waits after the failures-th failure in a row: a random time in
// the upper half of a window that doubles with each failure, up to
// campaignBackoffMax, or until ctx ends.
func backoff(ctx context.Context, failures int) error {
	window := min(campaignBackoffMax, campaignBackoffBase<<min(failures-1, 10))
	return clock.Sleep(ctx, clock.Real{}, window/2+rand.N(window/2))
}
