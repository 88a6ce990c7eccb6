package wire

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
)

// This file converts between tether.v1 and the lease package. Requests
// become messages only after the edge checks below, which name the request
// field that is wrong; a request that fails them is never judged (a
// Connect InvalidArgument, nothing recorded). The lease package's enums
// have the proto's numeric values, so they convert with a cast.

// Lease renders a lease; nil for a job without one.
func Lease(l lease.Lease) *tetherv1.Lease {
	if !l.Exists() {
		return nil
	}
	return leaseProto(l)
}

// EvidenceRow renders an evidence row: the judged message's kind goes by
// its name.
func EvidenceRow(r coordinator.Row) *tetherv1.EvidenceRow {
	m := evidenceRowProto(r)
	m.Message = r.Message.String()
	return m
}

// EvidenceRowFromProto is the inverse of EvidenceRow (the CLI renders rows
// with the lease package's CSV writer); a kind it does not know is
// lease.KindUnspecified.
func EvidenceRowFromProto(p *tetherv1.EvidenceRow) lease.EvidenceRow {
	r := evidenceRowFromProto(p)
	for k := lease.KindOffer; k <= lease.KindRecover; k++ {
		if k.String() == p.GetMessage() {
			r.Message = k
		}
	}
	return r
}

// LeasePolicy publishes the declared time policy, its restart and
// missed-ACK rules as sentences.
func LeasePolicy(p lease.Policy) *tetherv1.LeasePolicy {
	m := leasePolicyProto(p)
	m.RestartBehavior, m.AckMissPolicy = p.RestartBehavior(), p.AckMissBehavior()
	return m
}

func invalidLease(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{coordinator.ErrInvalidArgument}, args...)...)
}

// CheckID checks an identifier field (job_id, lease_id, holder_identity):
// present, at most lease.MaxIDBytes of UTF-8, no control characters.
func CheckID(field, v string) error {
	switch {
	case v == "":
		return invalidLease("%s is required", field)
	case len(v) > lease.MaxIDBytes:
		return invalidLease("%s is %d bytes, more than the %d-byte limit", field, len(v), lease.MaxIDBytes)
	case !utf8.ValidString(v):
		return invalidLease("%s is not valid UTF-8", field)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return invalidLease("%s contains a control character", field)
		}
	}
	return nil
}

// CheckText checks a free-text field (progress_value, detail, reason).
func CheckText(field, v string) error {
	switch {
	case len(v) > lease.MaxValueBytes:
		return invalidLease("%s is %d bytes, more than the %d-byte limit", field, len(v), lease.MaxValueBytes)
	case !utf8.ValidString(v):
		return invalidLease("%s is not valid UTF-8", field)
	}
	return nil
}

func sentAt(t *timestamppb.Timestamp) (time.Time, error) {
	if t == nil {
		return time.Time{}, nil
	}
	if err := t.CheckValid(); err != nil {
		return time.Time{}, invalidLease("sent_at: %v", err)
	}
	return t.AsTime(), nil
}

func claim(job, leaseID string, generation uint64, holder string, sent *timestamppb.Timestamp) (lease.Claim, error) {
	if err := CheckID("job_id", job); err != nil {
		return lease.Claim{}, err
	}
	if err := CheckID("lease_id", leaseID); err != nil {
		return lease.Claim{}, err
	}
	if generation == 0 {
		return lease.Claim{}, invalidLease("lease_generation must be at least 1 (generation 0 is never issued)")
	}
	if err := CheckID("holder_identity (the caller's node id)", holder); err != nil {
		return lease.Claim{}, err
	}
	at, err := sentAt(sent)
	if err != nil {
		return lease.Claim{}, err
	}
	return lease.Claim{JobID: job, LeaseID: leaseID, Generation: generation, HolderIdentity: holder, SentAt: at}, nil
}

// AckMessage turns an AckRequest from holder (the authenticated caller)
// into a message.
func AckMessage(r *tetherv1.AckRequest, holder string) (lease.Message, error) {
	c, err := claim(r.GetJobId(), r.GetLeaseId(), r.GetLeaseGeneration(), holder, r.GetSentAt())
	return lease.Ack{Claim: c}, err
}

// RenewMessage turns a RenewRequest from holder into a message.
func RenewMessage(r *tetherv1.RenewRequest, holder string) (lease.Message, error) {
	c, err := claim(r.GetJobId(), r.GetLeaseId(), r.GetLeaseGeneration(), holder, r.GetSentAt())
	if err == nil && r.GetRenewSequence() == 0 {
		err = invalidLease("renew_sequence must be at least 1")
	}
	return lease.Renew{Claim: c, RenewSequence: r.GetRenewSequence()}, err
}

// ProgressMessage turns a ProgressRequest from holder into a message.
func ProgressMessage(r *tetherv1.ProgressRequest, holder string) (lease.Message, error) {
	c, err := claim(r.GetJobId(), r.GetLeaseId(), r.GetLeaseGeneration(), holder, r.GetSentAt())
	if err == nil && r.GetProgressSequence() == 0 {
		err = invalidLease("progress_sequence must be at least 1")
	}
	if err == nil {
		err = CheckText("progress_value", r.GetProgressValue())
	}
	return lease.Progress{Claim: c, ProgressSequence: r.GetProgressSequence(), ProgressValue: r.GetProgressValue()}, err
}

// CancelAckMessage turns a cancel acknowledgement from holder into a
// message.
func CancelAckMessage(r *tetherv1.LeaseServiceCancelAckRequest, holder string) (lease.Message, error) {
	c, err := claim(r.GetJobId(), r.GetLeaseId(), r.GetLeaseGeneration(), holder, r.GetSentAt())
	return lease.CancelAck{Claim: c}, err
}

// CompleteMessage turns a terminal result from holder into a message.
func CompleteMessage(r *tetherv1.CompleteRequest, holder string) (lease.Message, error) {
	c, err := claim(r.GetJobId(), r.GetLeaseId(), r.GetLeaseGeneration(), holder, r.GetSentAt())
	result := lease.TerminalResult(r.GetResult())
	if err == nil {
		switch result {
		case lease.ResultSuccess, lease.ResultFailed, lease.ResultCancelled:
		default:
			err = invalidLease("result must be SUCCESS, FAILED or CANCELLED, not %s", result)
		}
	}
	if err == nil {
		err = CheckText("detail", r.GetDetail())
	}
	return lease.Complete{Claim: c, Result: result, Detail: r.GetDetail()}, err
}

// ChannelMessage turns one Channel request from holder into a message.
func ChannelMessage(r *tetherv1.ChannelRequest, holder string) (lease.Message, error) {
	switch m := r.GetMessage().(type) {
	case *tetherv1.ChannelRequest_Ack:
		return AckMessage(m.Ack, holder)
	case *tetherv1.ChannelRequest_Renew:
		return RenewMessage(m.Renew, holder)
	case *tetherv1.ChannelRequest_Progress:
		return ProgressMessage(m.Progress, holder)
	case *tetherv1.ChannelRequest_CancelAck:
		return CancelAckMessage(m.CancelAck, holder)
	case *tetherv1.ChannelRequest_Complete:
		return CompleteMessage(m.Complete, holder)
	}
	return nil, invalidLease("message is empty: set one of ack, renew, progress, cancel_ack, complete")
}

// durationField reads an optional duration field: nil means def; otherwise it
// must be within (0, max] (or [0, max] when zero is allowed).
func durationField(field string, d *durationpb.Duration, def, limit time.Duration, zeroOK bool) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalidLease("%s: %v", field, err)
	}
	v := d.AsDuration()
	switch {
	case v < 0 || (v == 0 && !zeroOK):
		return 0, invalidLease("%s must be positive, got %s", field, v)
	case v > limit:
		return 0, invalidLease("%s %s exceeds the policy maximum %s", field, v, limit)
	}
	return v, nil
}

// OfferMessage turns an OfferRequest into a message under policy p, with
// the new generation's lease id.
func OfferMessage(r *tetherv1.OfferRequest, leaseID string, p lease.Policy) (lease.Message, error) {
	if err := CheckID("job_id", r.GetJobId()); err != nil {
		return nil, err
	}
	if err := CheckID("holder_identity", r.GetHolderIdentity()); err != nil {
		return nil, err
	}
	d, err := durationField("lease_duration", r.GetLeaseDuration(), p.DefaultLeaseDuration, p.MaxLeaseDuration, false)
	if err != nil {
		return nil, err
	}
	ack, err := durationField("ack_timeout", r.GetAckTimeout(), 0, p.MaxLeaseDuration, false)
	if err != nil {
		return nil, err
	}
	return lease.Offer{JobID: r.GetJobId(), LeaseID: leaseID, HolderIdentity: r.GetHolderIdentity(), LeaseDuration: d, AckTimeout: ack}, nil
}

// ReassignMessage turns a ReassignRequest into a message. current is the
// job's lease (for the default duration: the current generation's).
func ReassignMessage(r *tetherv1.ReassignRequest, leaseID string, current lease.Lease, p lease.Policy) (lease.Message, error) {
	if err := CheckID("job_id", r.GetJobId()); err != nil {
		return nil, err
	}
	if err := CheckID("holder_identity", r.GetHolderIdentity()); err != nil {
		return nil, err
	}
	def := current.LeaseDuration
	if def == 0 {
		def = p.DefaultLeaseDuration
	}
	d, err := durationField("lease_duration", r.GetLeaseDuration(), def, p.MaxLeaseDuration, false)
	if err != nil {
		return nil, err
	}
	ack, err := durationField("ack_timeout", r.GetAckTimeout(), 0, p.MaxLeaseDuration, false)
	if err != nil {
		return nil, err
	}
	if err := CheckText("reason", r.GetReason()); err != nil {
		return nil, err
	}
	// An operator's reassignment of a conflicted lease is how the conflict
	// is settled: the reassignment names the authoritative holder.
	return lease.Reassign{JobID: r.GetJobId(), Generation: r.GetLeaseGeneration(), LeaseID: leaseID, HolderIdentity: r.GetHolderIdentity(), LeaseDuration: d,
		AckTimeout: ack, Reason: r.GetReason(), ResolveConflict: current.OwnershipConflict}, nil
}

// RequestCancelMessage turns a cancel request into a message.
func RequestCancelMessage(r *tetherv1.RequestCancelRequest) (lease.Message, error) {
	if err := CheckID("job_id", r.GetJobId()); err != nil {
		return nil, err
	}
	if err := CheckText("reason", r.GetReason()); err != nil {
		return nil, err
	}
	return lease.RequestCancel{JobID: r.GetJobId(), Generation: r.GetLeaseGeneration(), Reason: r.GetReason()}, nil
}

// ResolveMessage turns a ResolveRequest into a message under policy p.
func ResolveMessage(r *tetherv1.ResolveRequest, p lease.Policy) (lease.Message, error) {
	if err := CheckID("job_id", r.GetJobId()); err != nil {
		return nil, err
	}
	result := lease.TerminalResult(r.GetResult())
	var bound time.Duration
	switch result {
	case lease.ResultCancelled, lease.ResultFailed:
		if r.GetUnresolvedBound() != nil {
			return nil, invalidLease("unresolved_bound goes only with result UNRESOLVED")
		}
	case lease.ResultUnresolved:
		var err error
		if bound, err = durationField("unresolved_bound", r.GetUnresolvedBound(), 0, p.MaxUnresolvedBound, false); err != nil {
			return nil, err
		}
	case lease.ResultSuccess:
		return nil, invalidLease("result SUCCESS cannot be declared by the coordinator; only the holder's Complete reports success")
	default:
		return nil, invalidLease("result must be CANCELLED, FAILED or UNRESOLVED, not %s", result)
	}
	if err := CheckText("reason", r.GetReason()); err != nil {
		return nil, err
	}
	return lease.Resolve{JobID: r.GetJobId(), Generation: r.GetLeaseGeneration(), Result: result, UnresolvedBound: bound, Reason: r.GetReason()}, nil
}
