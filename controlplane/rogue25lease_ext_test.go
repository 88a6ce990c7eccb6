package controlplane_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Twenty-fifth hostile pass on job leases: what a former holder can learn
// of the generation that replaced its own.

// TestRogue25AFormerHolderCannotTestWhoHoldsItsJobNow: a former holder's
// late traffic is judged (seed §7, §11: kept as stale evidence) and its
// answer withholds the current generation's lease id and holder. It used
// to withhold them by replacing their quoted form in the judgement's text
// — text that also quotes what the former holder sent. So the former
// holder could put a guess in its message (the lease id it claims, a
// progress value) and read the answer: "(withheld)" where the guess was
// right, its own words where it was wrong — one stale message per
// candidate told it which agent holds its job now, and confirmed the
// current lease id. And when its message was the first the coordinator
// judged after the successor's lease ran out, the answer quoted the
// successor's expiry. Now the answer is the same whatever the guess, and
// carries nothing of the successor's lease; the evidence row keeps the
// whole judgement.
func TestRogue25AFormerHolderCannotTestWhoHoldsItsJobNow(t *testing.T) {
	transports(t, func(t *testing.T, w *leaseWorld, via func(*testserver.Clients) transport) {
		w1, w2 := via(w.w1C), via(w.w2C)
		job := w.job()
		l1, _ := w1.send(t, ack(w.offer(t, job, w.w1, time.Minute)))
		l2, _ := w2.send(t, ack(w.reassign(t, job, w.w2, time.Minute)))

		// Each pair: a right guess and a wrong one, sent the same way (the
		// same sequence: a stale message is refused before its sequence
		// is looked at).
		probes := []struct {
			what         string
			right, wrong string
			send         func(guess string) *tetherv1.ChannelRequest
		}{
			{"the holder, as the lease id it claims", w.w2, w.stranger, func(g string) *tetherv1.ChannelRequest {
				c := proto.Clone(l1).(*tetherv1.Lease)
				c.LeaseId = g
				return renew(c, 1)
			}},
			{"the lease id, as the lease id it claims", l2.LeaseId, l1.LeaseId + "x", func(g string) *tetherv1.ChannelRequest {
				c := proto.Clone(l1).(*tetherv1.Lease)
				c.LeaseId = g
				return cancelAck(c)
			}},
			{"the holder, as a progress value", w.w2, w.stranger, func(g string) *tetherv1.ChannelRequest {
				return progress(l1, 2, g)
			}},
		}
		for _, p := range probes {
			answer := func(guess string) string {
				t.Helper()
				rows := len(w.evidence(t, job))
				got, d := w1.send(t, p.send(guess))
				wantDecision(t, p.what, d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
				ev := w.evidence(t, job)
				if last := ev[len(ev)-1]; len(ev) != rows+1 || !strings.Contains(last.Reason, l2.LeaseId) || !strings.Contains(last.Reason, w.w2) {
					t.Fatalf("%s: the evidence row (%d rows, want %d) does not keep the whole judgement: %v", p.what, len(ev), rows+1, last)
				}
				// What the answer says apart from the guess itself.
				return strings.ReplaceAll(got.String()+" | "+d.Reason, guess, "<guess>")
			}
			right, wrong := answer(p.right), answer(p.wrong)
			if right != wrong {
				t.Errorf("guessing %s: the former holder tells a right guess from a wrong one:\nright: %s\nwrong: %s", p.what, right, wrong)
			}
		}

		// The successor's lease runs out; the former holder's message is
		// the first the coordinator judges after it.
		w.clock.Advance(2 * time.Minute)
		got, d := w1.send(t, renew(l1, 3))
		wantDecision(t, "a stale renew after the successor's expiry", d, tetherv1.Outcome_OUTCOME_REJECTED, tetherv1.AuditEvent_AUDIT_EVENT_STALE_GENERATION)
		expiry := l2.ExpiresAt.AsTime().UTC().Format(time.RFC3339Nano)
		if leaks := leaseLeaks(got.String()+" "+d.Reason, w.w2, l2.LeaseId, expiry); len(leaks) > 0 {
			t.Errorf("the former holder's answer shows the successor's %q:\n%v\n%s", leaks, got, d.Reason)
		}
		if got.GetLeaseGeneration() != 2 || got.GetState() != tetherv1.LeaseState_LEASE_STATE_EXPIRED {
			t.Errorf("the answer does not say where the job is: %v", got)
		}
	})
}

// TestRogue25BAMovedJobsNewHolderCannotTestWhoHeldItBefore: once an
// operator moves a job to another tree, the new tree's agents read the
// rows of their own generations, with the old tree's agents withheld
// (rogue15 tests). The old tree's rows were told apart, and its names
// withheld, by searching each row's reason for the old tree's node ids —
// the job's owner and former holders — and the reason also quotes what the
// new holder sent. So the new holder could report, as progress, the id of
// an agent it suspected had offered or held the job, and read its own
// evidence: the row was missing where the guess was right (taken for a
// late message of the old tree), there where it was wrong — and its own
// reports vanished from its own evidence. Now a row is the old tree's when
// its sender is, and an old tree's name is withheld where the row names it,
// not where the new holder's words happen to.
func TestRogue25BAMovedJobsNewHolderCannotTestWhoHeldItBefore(t *testing.T) {
	w := newLeaseWorld(t)
	ctx := context.Background()
	m := moveAcrossTrees(t, w)
	b := unary{m.holderC}
	sent := map[string]string{} // progress value → who it names
	for i, guess := range []struct{ who, id string }{
		{"the owner (right)", w.planner},
		{"the former holder (right)", w.w1},
		{"an agent of the old tree that never held it (wrong)", w.w2},
		{"no agent (wrong)", "n_nobody000000000000"},
	} {
		_, d := b.send(t, progress(m.l2, uint64(2+i), guess.id))
		wantDecision(t, "the new holder's progress naming "+guess.who, d, tetherv1.Outcome_OUTCOME_ACCEPTED, tetherv1.AuditEvent_AUDIT_EVENT_PROGRESS_RECORDED)
		sent[guess.id] = guess.who
	}
	resp, err := m.holderC.Lease.Evidence(ctx, connect.NewRequest(&tetherv1.EvidenceRequest{JobId: m.job}))
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{}
	for _, r := range resp.Msg.Rows {
		if r.Message != "progress" || r.ProgressSequence < 2 {
			continue
		}
		for id := range sent {
			if r.ProgressValue == id && strings.Contains(r.Reason, strconv.Quote(id)) {
				read[id] = true
			}
		}
	}
	for id, who := range sent {
		if !read[id] {
			t.Errorf("the new holder's own progress naming %s is not in its evidence as it sent it", who)
		}
	}
	// The old tree's names stay withheld where the rows name them, and its
	// late messages stay out.
	text := ""
	for _, r := range resp.Msg.Rows {
		if r.Message != "progress" || r.ProgressSequence < 2 {
			text += protojson.Format(r)
		}
	}
	if leaks := leaseLeaks(text, w.w1, w.planner, m.l1.LeaseId, m.lateProgress, m.lateDetail); len(leaks) > 0 {
		t.Errorf("the new holder reads the old tree's %q", leaks)
	}
}
