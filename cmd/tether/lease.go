package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/wire"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/lease"
)

func newLeaseCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Job leases: offer, ack, renew, progress, cancel, complete, reconcile, and the evidence matrix",
		Long: `Job leases. Coordinator commands (offer, cancel, reassign, resolve) need an operator
token or the credential of an ancestor of the holder; worker commands (ack, renew,
progress, cancel-ack, complete) need the holder's own agent credential (--token):
the holder identity is always the caller's node id.

Every mutation prints the coordinator's decision: ACCEPTED, DUPLICATE or REJECTED,
the audit event and the reason.`,
	}
	cmd.AddCommand(leaseOffer(g), leaseAck(g), leaseRenew(g), leaseProgress(g), leaseCancel(g), leaseCancelAck(g),
		leaseComplete(g), leaseReassign(g), leaseResolve(g), leaseShow(g), leaseList(g), leaseEvidence(g), leasePolicy(g))
	return cmd
}

// decidedAnswer is a lease mutation's answer: the coordinator's decision
// and the lease it left.
type decidedAnswer interface {
	proto.Message
	GetLease() *tetherv1.Lease
	GetDecision() *tetherv1.Decision
}

// leaseMutation is a command that sends one message about JOB to the
// coordinator and prints its decision. check, when not nil, reads the
// command's flags before anything is dialed.
func leaseMutation(g *globals, use, short string, check func() error, send func(ctx context.Context, c *clients, job string) (decidedAnswer, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if check != nil {
				if err := check(); err != nil {
					return err
				}
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			msg, err := send(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			return printDecision(g, cmd.OutOrStdout(), msg)
		},
	}
}

// claim is what a holder's message names: the job, the lease id and
// generation it holds (--lease-id, --generation), and when it was sent.
type claim struct {
	job        string
	leaseID    string
	generation uint64
	sentAt     *timestamppb.Timestamp
}

// holderMutation is a worker command: a lease mutation whose message
// carries the holder's claim, from the flags every worker command has.
func holderMutation(g *globals, use, short string, check func() error, send func(ctx context.Context, c *clients, h claim) (decidedAnswer, error)) *cobra.Command {
	h := claim{}
	cmd := leaseMutation(g, use, short, check, func(ctx context.Context, c *clients, job string) (decidedAnswer, error) {
		h.job, h.sentAt = job, timestamppb.Now()
		return send(ctx, c, h)
	})
	cmd.Flags().StringVar(&h.leaseID, "lease-id", "", "the lease id of the generation you hold")
	cmd.Flags().Uint64Var(&h.generation, "generation", 0, "the lease generation you hold")
	_ = cmd.MarkFlagRequired("lease-id")
	_ = cmd.MarkFlagRequired("generation")
	return cmd
}

// printDecision prints a mutation's answer.
func printDecision(g *globals, w io.Writer, msg decidedAnswer) error {
	if err := carried("decision", "", "", msg.GetDecision() != nil); err != nil {
		return err
	}
	if done, err := g.printedAsJSON(w, msg); done || err != nil {
		return err
	}
	l, d := msg.GetLease(), msg.GetDecision()
	fmt.Fprintf(w, "decision:  %s %s\nreason:    %s\n", strings.TrimPrefix(d.GetOutcome().String(), "OUTCOME_"),
		strings.TrimPrefix(d.GetAuditEvent().String(), "AUDIT_EVENT_"), printable(d.GetReason()))
	if l != nil {
		fmt.Fprintln(w)
		return printLease(w, l)
	}
	return nil
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}

func printLease(w io.Writer, l *tetherv1.Lease) error {
	tw := newTable(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, printable(v)) }
	row("job_id", printableJob(l.JobId))
	row("lease_id", l.LeaseId)
	row("generation", fmt.Sprint(l.LeaseGeneration))
	row("holder", l.HolderIdentity)
	row("state", strings.TrimPrefix(l.State.String(), "LEASE_STATE_"))
	row("issued_at", ts(l.IssuedAt))
	row("lease_duration", l.LeaseDuration.AsDuration().String())
	row("ack", fmt.Sprintf("%s (deadline %s)", strings.TrimPrefix(l.AckState.String(), "ACK_STATE_"), ts(l.AckDeadline)))
	row("expires_at", ts(l.ExpiresAt))
	row("acquire_time", ts(l.AcquireTime))
	row("last_renew_time", ts(l.LastRenewTime))
	row("transitions", fmt.Sprint(l.LeaseTransitions))
	row("auto reassigns", fmt.Sprint(l.AutoReassigns))
	row("renew", fmt.Sprintf("seq %d at %s", l.RenewSequence, ts(l.RenewTime)))
	row("progress", fmt.Sprintf("seq %d %q", l.ProgressSequence, l.ProgressValue))
	row("cancel", fmt.Sprintf("requested %v (%s), acked %v (%s)", l.CancelRequested, ts(l.CancelRequestedAt), l.CancelAck, ts(l.CancelAckedAt)))
	result := strings.TrimPrefix(l.TerminalResult.String(), "TERMINAL_RESULT_")
	if l.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED {
		result += " until " + ts(l.UnresolvedUntil)
	}
	by := ""
	switch {
	case l.TerminalResult == tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED:
	case l.ResolvedByCoordinator:
		by = " (resolved by the coordinator)"
	default:
		by = " (reported by the holder)"
	}
	// Whose word closed the job comes before the detail, which is the
	// holder's own text when it reported the result.
	row("terminal", fmt.Sprintf("%s at %s%s %s", result, ts(l.TerminalAt), by, l.TerminalDetail))
	flags := fmt.Sprintf("stale_generation=%v late_progress=%v lease_expired=%v ownership_conflict=%v", l.StaleGeneration, l.LateProgress, l.LeaseExpired, l.OwnershipConflict)
	if l.OwnershipConflict {
		flags += " (with " + l.ConflictHolder + ")"
	}
	row("flags", flags)
	return tw.Flush()
}

func durationFlag(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func leaseOffer(g *globals) *cobra.Command {
	var holder string
	var duration, ackTimeout time.Duration
	cmd := leaseMutation(g, "offer JOB --holder NODE [--duration 30s] [--ack-timeout 10s]",
		"Offer a job to a holder: generation 1, OFFERED until it ACKs", nil,
		func(ctx context.Context, c *clients, job string) (decidedAnswer, error) {
			return answer(c.Lease.Offer(ctx, connect.NewRequest(&tetherv1.OfferRequest{
				JobId: job, HolderIdentity: holder, LeaseDuration: durationFlag(duration), AckTimeout: durationFlag(ackTimeout),
			})))
		})
	cmd.Flags().StringVar(&holder, "holder", "", "the holder's agent node id")
	cmd.Flags().DurationVar(&duration, "duration", 0, "lease duration (default: the policy's)")
	cmd.Flags().DurationVar(&ackTimeout, "ack-timeout", 0, "how long the holder has to ACK (default: the policy's)")
	_ = cmd.MarkFlagRequired("holder")
	return cmd
}

func leaseAck(g *globals) *cobra.Command {
	return holderMutation(g, "ack JOB --lease-id L --generation N",
		"Accept an offer (holder): ACTIVE until the expiry; never completion", nil,
		func(ctx context.Context, c *clients, h claim) (decidedAnswer, error) {
			return answer(c.Lease.Ack(ctx, connect.NewRequest(&tetherv1.AckRequest{
				JobId: h.job, LeaseId: h.leaseID, LeaseGeneration: h.generation, SentAt: h.sentAt,
			})))
		})
}

func leaseRenew(g *globals) *cobra.Command {
	var seq uint64
	cmd := holderMutation(g, "renew JOB --lease-id L --generation N --sequence S",
		"Renew the lease (holder), with a renew sequence above the accepted one", nil,
		func(ctx context.Context, c *clients, h claim) (decidedAnswer, error) {
			return answer(c.Lease.Renew(ctx, connect.NewRequest(&tetherv1.RenewRequest{
				JobId: h.job, LeaseId: h.leaseID, LeaseGeneration: h.generation, RenewSequence: seq, SentAt: h.sentAt,
			})))
		})
	cmd.Flags().Uint64Var(&seq, "sequence", 0, "renew sequence")
	_ = cmd.MarkFlagRequired("sequence")
	return cmd
}

func leaseProgress(g *globals) *cobra.Command {
	var seq uint64
	var value string
	cmd := holderMutation(g, "progress JOB --lease-id L --generation N --sequence S --value V",
		"Report progress (holder); progress never renews", nil,
		func(ctx context.Context, c *clients, h claim) (decidedAnswer, error) {
			return answer(c.Lease.Progress(ctx, connect.NewRequest(&tetherv1.ProgressRequest{
				JobId: h.job, LeaseId: h.leaseID, LeaseGeneration: h.generation, ProgressSequence: seq, ProgressValue: value, SentAt: h.sentAt,
			})))
		})
	cmd.Flags().Uint64Var(&seq, "sequence", 0, "progress sequence")
	cmd.Flags().StringVar(&value, "value", "", "progress value")
	_ = cmd.MarkFlagRequired("sequence")
	return cmd
}

func leaseCancel(g *globals) *cobra.Command {
	var reason string
	var generation uint64
	cmd := leaseMutation(g, "cancel JOB [--generation N] [--reason R]",
		"Request cancellation (coordinator): intent only; the job still needs a terminal result", nil,
		func(ctx context.Context, c *clients, job string) (decidedAnswer, error) {
			return answer(c.Lease.RequestCancel(ctx, connect.NewRequest(&tetherv1.RequestCancelRequest{JobId: job, Reason: reason, LeaseGeneration: generation})))
		})
	cmd.Flags().StringVar(&reason, "reason", "", "why")
	cmd.Flags().Uint64Var(&generation, "generation", 0, "the lease generation this decision is about; refused as stale if it was replaced meanwhile (default: whichever is current)")
	return cmd
}

func leaseCancelAck(g *globals) *cobra.Command {
	return holderMutation(g, "cancel-ack JOB --lease-id L --generation N",
		"Acknowledge a cancel request (holder); it does not prove the work stopped", nil,
		func(ctx context.Context, c *clients, h claim) (decidedAnswer, error) {
			return answer(c.Lease.CancelAck(ctx, connect.NewRequest(&tetherv1.LeaseServiceCancelAckRequest{
				JobId: h.job, LeaseId: h.leaseID, LeaseGeneration: h.generation, SentAt: h.sentAt,
			})))
		})
}

// resultFlag is --result: one of the terminal results allowed, parsed
// before anything is dialed.
type resultFlag struct {
	text    string
	allowed []tetherv1.TerminalResult
	result  tetherv1.TerminalResult
}

func (f *resultFlag) add(cmd *cobra.Command, usage string) {
	cmd.Flags().StringVar(&f.text, "result", "", usage)
	_ = cmd.MarkFlagRequired("result")
}

func (f *resultFlag) parse() error {
	var names []string
	for _, r := range f.allowed {
		name := strings.ToLower(strings.TrimPrefix(r.String(), "TERMINAL_RESULT_"))
		names = append(names, name)
		if strings.EqualFold(f.text, name) {
			f.result = r
			return nil
		}
	}
	return fmt.Errorf("--result %q: want one of %s", f.text, strings.Join(names, ", "))
}

func leaseComplete(g *globals) *cobra.Command {
	result := &resultFlag{allowed: []tetherv1.TerminalResult{tetherv1.TerminalResult_TERMINAL_RESULT_SUCCESS, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED}}
	var detail string
	cmd := holderMutation(g, "complete JOB --lease-id L --generation N --result success|failed|cancelled [--detail D]",
		"Report the terminal result (holder), accepted only within the active lease", result.parse,
		func(ctx context.Context, c *clients, h claim) (decidedAnswer, error) {
			return answer(c.Lease.Complete(ctx, connect.NewRequest(&tetherv1.CompleteRequest{
				JobId: h.job, LeaseId: h.leaseID, LeaseGeneration: h.generation, Result: result.result, Detail: detail, SentAt: h.sentAt,
			})))
		})
	result.add(cmd, "success, failed or cancelled")
	cmd.Flags().StringVar(&detail, "detail", "", "detail")
	return cmd
}

func leaseReassign(g *globals) *cobra.Command {
	var holder, reason string
	var duration, ackTimeout time.Duration
	var generation uint64
	cmd := leaseMutation(g, "reassign JOB --holder NODE [--generation N] [--duration D] [--ack-timeout T] [--reason R]",
		"Issue generation + 1 to a holder (coordinator); fences off every earlier generation and settles an ownership conflict", nil,
		func(ctx context.Context, c *clients, job string) (decidedAnswer, error) {
			return answer(c.Lease.Reassign(ctx, connect.NewRequest(&tetherv1.ReassignRequest{
				JobId: job, HolderIdentity: holder, LeaseDuration: durationFlag(duration), AckTimeout: durationFlag(ackTimeout), Reason: reason, LeaseGeneration: generation,
			})))
		})
	cmd.Flags().StringVar(&holder, "holder", "", "the new holder's agent node id")
	cmd.Flags().Uint64Var(&generation, "generation", 0, "the lease generation this decision is about; refused as stale if it was replaced meanwhile (default: whichever is current)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "lease duration (default: the current generation's)")
	cmd.Flags().DurationVar(&ackTimeout, "ack-timeout", 0, "ACK timeout (default: the policy's)")
	cmd.Flags().StringVar(&reason, "reason", "", "why")
	_ = cmd.MarkFlagRequired("holder")
	return cmd
}

func leaseResolve(g *globals) *cobra.Command {
	result := &resultFlag{allowed: []tetherv1.TerminalResult{tetherv1.TerminalResult_TERMINAL_RESULT_CANCELLED, tetherv1.TerminalResult_TERMINAL_RESULT_FAILED, tetherv1.TerminalResult_TERMINAL_RESULT_UNRESOLVED}}
	var reason string
	var bound time.Duration
	var generation uint64
	cmd := leaseMutation(g, "resolve JOB --result cancelled|failed|unresolved [--generation N] [--bound D] [--reason R]",
		"Explicit terminal reconciliation (coordinator); CANCELLED needs a cancel request first; UNRESOLVED is bounded, then FAILED", result.parse,
		func(ctx context.Context, c *clients, job string) (decidedAnswer, error) {
			return answer(c.Lease.Resolve(ctx, connect.NewRequest(&tetherv1.ResolveRequest{
				JobId: job, Result: result.result, UnresolvedBound: durationFlag(bound), Reason: reason, LeaseGeneration: generation,
			})))
		})
	result.add(cmd, "cancelled, failed or unresolved")
	cmd.Flags().Uint64Var(&generation, "generation", 0, "the lease generation this decision is about; refused as stale if it was replaced meanwhile (default: whichever is current)")
	cmd.Flags().DurationVar(&bound, "bound", 0, "for unresolved: how long until it must be revisited (default: the policy's maximum)")
	cmd.Flags().StringVar(&reason, "reason", "", "why")
	return cmd
}

func leaseShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show JOB",
		Short: "Show a job's lease (durable state), with Kubernetes-style acquire time, last renew and transitions",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := g.wantJSON()
			if err != nil {
				return err
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Lease.GetLease(cmd.Context(), connect.NewRequest(&tetherv1.GetLeaseRequest{JobId: args[0]}))
			if err != nil {
				return err
			}
			if err := carried("lease", args[0], resp.Msg.GetLease().GetJobId(), resp.Msg.GetLease().GetJobId() != ""); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp.Msg.Lease)
			}
			return printLease(cmd.OutOrStdout(), resp.Msg.Lease)
		},
	}
}

func leaseList(g *globals) *cobra.Command {
	var holder, token string
	var limit int
	cmd := &cobra.Command{
		Use:   "list [--holder NODE] [--limit N] [--page-token T]",
		Short: "List leases, in job id order, a page at a time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := g.wantJSON(); err != nil {
				return err // a bad -o is refused before any call
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			// The server's page token is the last job id listed, the text
			// of whoever offered the job: it is printed base64url-encoded,
			// so that the next-page line an operator copies into a shell
			// carries none of it ("x; tether agent terminate n_…").
			after, err := base64.RawURLEncoding.DecodeString(token)
			if err != nil {
				return fmt.Errorf("--page-token %q: not a page token tether lease list printed", token)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			// A page at a time, never every lease: whoever offers a job
			// chooses its id, and so which leases come first, and ended
			// ones are kept.
			all, next, err := somePages(limit, recordsCalls, string(after), func(token string, size int32) ([]*tetherv1.Lease, string, error) {
				resp, err := c.Lease.ListLeases(cmd.Context(), connect.NewRequest(&tetherv1.ListLeasesRequest{HolderIdentity: holder, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.Leases, resp.Msg.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			more := nextPageLine(g, cmd, "tether lease list", base64.RawURLEncoding.EncodeToString([]byte(next)), "--holder", holder, "--limit", limitFlag(limit, recordsLimit))
			if err := printList(g, cmd.OutOrStdout(), all, "JOB\tGEN\tHOLDER\tSTATE\tEXPIRES\tRESULT", func(l *tetherv1.Lease) []string {
				return []string{printableJob(l.JobId), fmt.Sprint(l.LeaseGeneration), l.HolderIdentity,
					strings.TrimPrefix(l.State.String(), "LEASE_STATE_"), ts(l.ExpiresAt), strings.TrimPrefix(l.TerminalResult.String(), "TERMINAL_RESULT_")}
			}); err != nil || more == "" {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		},
	}
	cmd.Flags().StringVar(&holder, "holder", "", "only leases held by this agent")
	cmd.Flags().IntVar(&limit, "limit", recordsLimit, "print at most this many leases (1 to 10000)")
	cmd.Flags().StringVar(&token, "page-token", "", "the next page's token, as the previous page printed it")
	return cmd
}

func leaseEvidence(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:         "evidence JOB [-o csv|json|table]",
		Annotations: map[string]string{outputFormats: "table, json or csv (the evidence matrix's columns)"},
		Short:       "The evidence matrix: one row per decision, rejected messages included",
		Long: `The evidence matrix of a job: one row per message the coordinator judged, in order,
rejected ones included. -o csv writes exactly the seed's columns (paired columns such as
"ACK Deadline/State" hold both values separated by " / "); -o json adds each row's number,
message kind and decision time.`,
		Args: cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			// The server pages the evidence (at most 1000 rows an answer);
			// csv and table rows are written page by page as they arrive.
			// Every page carries the former holders' counts of their late
			// messages; the table prints the last page's after the rows.
			var stale []*tetherv1.StaleCount
			pages := func(each func([]*tetherv1.EvidenceRow) error) error {
				token := ""
				seen := map[[sha256.Size]byte]bool{}
				for {
					resp, err := c.Lease.Evidence(cmd.Context(), connect.NewRequest(&tetherv1.EvidenceRequest{JobId: args[0], PageToken: token}))
					if err != nil {
						return err
					}
					if err := each(resp.Msg.Rows); err != nil {
						return err
					}
					stale = resp.Msg.StaleCounts
					next := resp.Msg.NextPageToken
					if next == "" {
						return nil
					}
					// The server's pages always move on: a token answered
					// before (the page asked for, or any earlier one: a
					// path to it that alternates or cycles its pages)
					// would print the same rows for ever.
					if seen[sha256.Sum256([]byte(next))] || next == token {
						return errors.New("the server named a page already read as the next; stopping")
					}
					seen[sha256.Sum256([]byte(token))] = true
					token = next
				}
			}
			out := cmd.OutOrStdout()
			switch g.output {
			case "json":
				var rows []*tetherv1.EvidenceRow
				if err := pages(func(page []*tetherv1.EvidenceRow) error {
					rows = append(rows, page...)
					return nil
				}); err != nil {
					return err
				}
				return printJSONList(out, rows)
			case "csv":
				w := csv.NewWriter(out)
				if err := w.Write(lease.SeedHeader()); err != nil {
					return err
				}
				if err := pages(func(page []*tetherv1.EvidenceRow) error {
					for _, r := range page {
						// Each cell as the table shows it: the CSV reaches
						// the operator's terminal unless redirected, and a
						// holder's progress value "\x1b[1A\x1b[2K\r…" (or
						// a line break in its quoted cell) wrote a row of
						// the holder's making over the matrix's.
						cells := wire.EvidenceRowFromProto(r).SeedRecord()
						for i, c := range cells {
							cells[i] = printable(c)
						}
						if err := w.Write(cells); err != nil {
							return err
						}
					}
					w.Flush()
					return w.Error()
				}); err != nil {
					return err
				}
				w.Flush()
				return w.Error()
			case "table", "":
				tw := newTable(out)
				fmt.Fprintln(tw, "ROW\tMESSAGE\tGEN\tHOLDER\tSTATE FLAGS\tDECISION\tREASON")
				err := pages(func(page []*tetherv1.EvidenceRow) error { return printEvidenceRows(tw, page) })
				if err != nil {
					return err
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				return printStaleCounts(out, stale)
			}
			return fmt.Errorf("-o %q: want csv, json or table", g.output)
		}),
	}
}

// printEvidenceRows writes rows to the evidence table.
func printEvidenceRows(tw io.Writer, rows []*tetherv1.EvidenceRow) error {
	for _, r := range rows {
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{r.StaleGeneration, "stale"}, {r.LateProgress, "late"}, {r.LeaseExpired, "expired"}, {r.OwnershipConflict, "conflict"}, {r.CancelRequested, "cancel"}, {r.CancelAck, "acked"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		reason := r.Reason
		if len(reason) > 100 {
			reason = shortReason(reason, 100, wire.EvidenceRowFromProto(r).Message.FromWorker())
		}
		reason = printable(reason)
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s %s\t%s\n", r.Row, r.Message, r.Generation, printable(r.HolderIdentity), strings.Join(flags, ","),
			strings.TrimPrefix(r.Decision.GetOutcome().String(), "OUTCOME_"), strings.TrimPrefix(r.Decision.GetAuditEvent().String(), "AUDIT_EVENT_"), reason)
	}
	return nil
}

// shortReason shortens a row's reason for the table to its first max
// bytes. The reason of a worker message is the only place that names its
// sender (` from "<node>"`, package lease's describe), and the HOLDER
// column is the job's holder after the message, not its sender: when the
// cut drops the sender — a former holder's late message claiming a long
// lease id, or one after notes on what the clock decided — the shortened
// reason ends with it, so that a former holder's rows never read as the
// current holder's.
//
// A coordinator's decision names who made it the same way: its reason
// quotes the decision's own, which the API signs with the principal that
// sent it (`(reason "agent:n_…: …")`, `the resolve's reason: "operator:…"`),
// well past the cut in a cancel request's row. When the cut drops the
// signer, the shortened reason ends with ` by <principal>`.
func shortReason(reason string, max int, fromWorker bool) string {
	short := reason[:max] + "…"
	if fromWorker {
		if at, clause, ok := quotedAfter(reason, " from "); ok && at+len(clause) > max {
			short += clause
		}
		return short
	}
	for _, intro := range []string{"(reason ", "reason: "} {
		at, clause, ok := quotedAfter(reason, intro)
		if !ok {
			continue
		}
		text, err := strconv.Unquote(clause[len(intro):])
		if err != nil {
			break
		}
		if who, signed := lease.SignerOf(text); signed && at+len(intro)+1+len(who) > max {
			short += " by " + who
		}
		break
	}
	return short
}

// quotedAfter finds the first intro outside a quoted text that a quoted
// text follows, and returns where it begins and intro with that text.
// Every text a sender chose is quoted (Go syntax, quotes escaped), so
// none of its words is taken for the intro: a worker message's reason
// names its sender as ` from "<node>"`, a decision's quotes its reason
// after "(reason " or "reason: ".
func quotedAfter(reason, intro string) (at int, clause string, ok bool) {
	for i := 0; i < len(reason); {
		switch {
		case reason[i] == '"':
			q, err := strconv.QuotedPrefix(reason[i:])
			if err != nil {
				return 0, "", false
			}
			i += len(q)
		case strings.HasPrefix(reason[i:], intro+`"`):
			q, err := strconv.QuotedPrefix(reason[i+len(intro):])
			if err != nil {
				return 0, "", false
			}
			return i, intro + q, true
		default:
			i++
		}
	}
	return 0, "", false
}

// printStaleCounts writes what each former holder sent about the job
// after it stopped holding it: its first messages are rows of the table
// (kept), the later ones that changed nothing only counted (folded).
func printStaleCounts(out io.Writer, counts []*tetherv1.StaleCount) error {
	if len(counts) == 0 {
		return nil
	}
	fmt.Fprintln(out, "\nLate messages of former holders, and of the holder after its generation ended (each judged and answered; the first kept as rows above, the rest only counted):")
	tw := newTable(out)
	fmt.Fprintln(tw, "FORMER HOLDER\tKEPT AS ROWS\tFOLDED INTO THE COUNT")
	for _, c := range counts {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", printable(c.HolderIdentity), c.Kept, c.Folded)
	}
	return tw.Flush()
}

func leasePolicy(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "policy",
		Short: "Show the coordinator's declared time policy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := g.wantJSON()
			if err != nil {
				return err
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Lease.GetPolicy(cmd.Context(), connect.NewRequest(&tetherv1.GetPolicyRequest{}))
			if err != nil {
				return err
			}
			if err := carried("policy", "", "", resp.Msg.Policy != nil); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), resp.Msg.Policy)
			}
			p := resp.Msg.Policy
			tw := newTable(cmd.OutOrStdout())
			fmt.Fprintf(tw, "clock source:\t%s\n", p.ClockSource)
			fmt.Fprintf(tw, "skew allowance:\t%s (sent_at is evidence only; it never extends or shortens authority)\n", p.SkewAllowance.AsDuration())
			fmt.Fprintf(tw, "default lease duration:\t%s\n", p.DefaultLeaseDuration.AsDuration())
			fmt.Fprintf(tw, "max lease duration:\t%s\n", p.MaxLeaseDuration.AsDuration())
			fmt.Fprintf(tw, "default ack timeout:\t%s\n", p.DefaultAckTimeout.AsDuration())
			fmt.Fprintf(tw, "max unresolved bound:\t%s\n", p.MaxUnresolvedBound.AsDuration())
			fmt.Fprintf(tw, "ack miss:\t%s\n", p.AckMissPolicy)
			fmt.Fprintf(tw, "max auto reassigns:\t%d (in a row, under ack miss reassign; set by tether serve --lease-max-auto-reassigns)\n", p.MaxAutoReassigns)
			fmt.Fprintf(tw, "restart:\t%s\n", p.RestartBehavior)
			return tw.Flush()
		},
	}
}
