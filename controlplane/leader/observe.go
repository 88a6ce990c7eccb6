package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Candidate is a replica as the election publishes it.
type Candidate struct {
	// Identity names the replica (Etcd.Identity).
	Identity string `json:"identity"`
	// Address is how the other replicas reach it (Etcd.Address); empty
	// when it did not publish one.
	Address string `json:"address,omitempty"`
}

// Observer is an Elector whose replicas can learn which one leads, so that
// they can forward to it the work only the leader does.
type Observer interface {
	Elector
	// Self is this replica as it campaigns.
	Self() Candidate
	// Observe calls fn with the replica that leads — the zero Candidate
	// while none does — at once and then at every change, until ctx ends;
	// it then returns nil. fn runs on Observe's goroutine.
	Observe(ctx context.Context, fn func(Candidate)) error
}

var _ Observer = (*Etcd)(nil)

// encodeCandidate is the election value: JSON, so that it can grow.
func encodeCandidate(c Candidate) string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // two strings always marshal
	}
	return string(b)
}

// decodeCandidate reads an election value; a value that is not a JSON
// candidate (written before addresses were published) is an identity.
func decodeCandidate(v []byte) Candidate {
	var c Candidate
	if json.Unmarshal(v, &c) == nil && c.Identity != "" {
		return c
	}
	return Candidate{Identity: string(v)}
}

// Self is this replica as it campaigns: Identity (or its default) and
// Address.
func (e *Etcd) Self() Candidate {
	identity := e.Identity
	if identity == "" {
		host, _ := os.Hostname()
		identity = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	return Candidate{Identity: identity, Address: e.Address}
}

// errObserveEnded: a watch of the election ended without telling why (its
// context ended, or the etcd member lost its own leader).
var errObserveEnded = errors.New("leader: the election watch ended")

// Observe follows the election: the leader is the candidate with the
// oldest key (as concurrency.Election defines it). It reads that key,
// reports its candidate, and watches it until it is deleted (the leader
// resigned, or its session lease expired), then reads the next. While no
// key exists it reports the zero Candidate and waits for one. A failed
// read or watch (etcd unreachable, a member without a leader) is retried
// with a jittered backoff; until then the last report stands.
func (e *Etcd) Observe(ctx context.Context, fn func(Candidate)) error {
	if e.Client == nil || e.Prefix == "" {
		return errors.New("leader: an etcd elector needs a Client and a Prefix")
	}
	log := e.Log
	if log == nil {
		log = slog.Default()
	}
	var last Candidate
	reported := false
	report := func(c Candidate) {
		if !reported || c != last {
			last, reported = c, true
			fn(c)
		}
	}
	failures := 0
	for ctx.Err() == nil {
		err := e.observeOnce(ctx, report)
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			failures = 0
			continue
		}
		failures++
		log.Debug("observing the election; retrying", "error", err)
		if backoff(ctx, failures) != nil {
			break
		}
	}
	return nil
}

// observeOnce reports the current leader and returns nil once it changes
// (the caller reads again), or an error.
func (e *Etcd) observeOnce(ctx context.Context, report func(Candidate)) error {
	resp, err := e.Client.Get(ctx, e.Prefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return fmt.Errorf("read the election: %w", err)
	}
	watchCtx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	if len(resp.Kvs) == 0 {
		report(Candidate{})
		// Wait for the first candidate.
		watch := e.Client.Watch(watchCtx, e.Prefix+"/", clientv3.WithPrefix(),
			clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterDelete())
		for wr := range watch {
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch the election: %w", err)
			}
			if len(wr.Events) > 0 {
				return nil
			}
		}
		return errObserveEnded
	}
	kv := resp.Kvs[0]
	report(decodeCandidate(kv.Value))
	watch := e.Client.Watch(watchCtx, string(kv.Key), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range watch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the leader's key: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
			report(decodeCandidate(ev.Kv.Value))
		}
	}
	return errObserveEnded
}
