package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/agentsdk"
	"github.com/tetherhq/tether/internal/sortedmap"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newRecordCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "record", Short: "Reconciliation records"}
	cmd.AddCommand(&cobra.Command{
		Use:   "show ID",
		Short: "Show a record (a readable summary; -o json for the full record). ID is a record or termination id",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			req := &tetherv1.GetRecordRequest{RecordId: args[0]}
			if strings.HasPrefix(args[0], "t_") {
				req = &tetherv1.GetRecordRequest{TerminationId: args[0]}
			}
			// A large record arrives in pages: read them all.
			rec, err := agentsdk.ReadRecord(cmd.Context(), c.Supervisor, req)
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), rec); done || err != nil {
				return err
			}
			PrintRecordSummary(cmd.OutOrStdout(), rec)
			return nil
		}),
	}, newRecordLsCommand(g))
	return cmd
}

// recordRequesters are --requested-by's values.
var recordRequesters = map[string]tetherv1.RecordRequester{
	"":         tetherv1.RecordRequester_RECORD_REQUESTER_UNSPECIFIED,
	"operator": tetherv1.RecordRequester_RECORD_REQUESTER_OPERATOR,
	"agent":    tetherv1.RecordRequester_RECORD_REQUESTER_AGENT,
	"rollout":  tetherv1.RecordRequester_RECORD_REQUESTER_ROLLOUT,
}

// recordsLimit is how many records `record ls` (and proposals `proposal
// ls`) prints by default, from at most recordsCalls listings.
const (
	recordsLimit = 1000
	recordsCalls = 20
)

func newRecordLsCommand(g *globals) *cobra.Command {
	var treeNode, requestedBy, token string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [--tree NODE] [--requested-by operator|agent|rollout] [--limit N] [--page-token T]",
		Short: "List records, a page at a time (--tree, --requested-by: one tree's, one kind of requester's)",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			by, ok := recordRequesters[requestedBy]
			if !ok {
				return fmt.Errorf("--requested-by %q: want operator, agent or rollout", requestedBy)
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			// A page at a time, never every record: an agent that stops
			// its own children writes a record each time, and the listing
			// read and printed them all.
			var recs []*tetherv1.ReconciliationRecord
			for calls := 0; calls < recordsCalls && len(recs) < limit; calls++ {
				resp, err := c.Supervisor.ListRecords(cmd.Context(), connect.NewRequest(&tetherv1.ListRecordsRequest{PageToken: token, PageSize: int32(min(limit-len(recs), 100)), TreeNodeId: treeNode, RequestedBy: by}))
				if err != nil {
					return err
				}
				// A record too large to list whole is listed in part: read
				// it whole, so its counts are right.
				for i, r := range resp.Msg.Records {
					if slices.Contains(resp.Msg.PartialRecordIds, r.RecordId) {
						if resp.Msg.Records[i], err = agentsdk.ReadRecord(cmd.Context(), c.Supervisor, &tetherv1.GetRecordRequest{RecordId: r.RecordId}); err != nil {
							return err
						}
					}
				}
				recs = append(recs, resp.Msg.Records...)
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			more := ""
			if token != "" {
				more = "… more: tether record ls --page-token " + token
				if treeNode != "" {
					more += " --tree " + treeNode
				}
				if requestedBy != "" {
					more += " --requested-by " + requestedBy
				}
				if limit != recordsLimit {
					more += " --limit " + strconv.Itoa(limit)
				}
				if asJSON, _ := g.wantJSON(); asJSON {
					fmt.Fprintln(cmd.ErrOrStderr(), more)
					more = ""
				}
			}
			if err := printList(g, cmd.OutOrStdout(), recs, "RECORD\tTERMINATION\tNODE\tMODE\tNODES\tUNACCOUNTED\tLEFT TO OTHERS\tRAN ON AFTER CANCEL\tWRITTEN", func(r *tetherv1.ReconciliationRecord) []string {
				n := countNodes(r)
				return []string{r.RecordId, r.TerminationId, r.NodeId, modeName(r.Mode), fmt.Sprint(len(r.Nodes)), fmt.Sprint(n.unaccounted), fmt.Sprint(n.leftTo), fmt.Sprint(countRanOn(r)), r.WrittenAt.AsTime().Format("2006-01-02T15:04:05Z")}
			}); err != nil || more == "" {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		}),
	}
	cmd.Flags().StringVar(&treeNode, "tree", "", "only the records of this node's tree (any node id of it)")
	cmd.Flags().StringVar(&requestedBy, "requested-by", "", "only the records of stops requested by: operator, agent or rollout")
	cmd.Flags().IntVar(&limit, "limit", recordsLimit, "print at most this many records (1 to 10000)")
	cmd.Flags().StringVar(&token, "page-token", "", "the next page's token, as the previous page printed it")
	return cmd
}

func modeName(m tetherv1.TerminationMode) string {
	return strings.ToLower(strings.TrimPrefix(m.String(), "TERMINATION_MODE_"))
}

// nodeCounts are a record's nodes by outcome: confirmed, left to another
// termination (superseded: that one accounts for the node, its record
// tells its end), and unaccounted (any other).
type nodeCounts struct{ confirmed, unaccounted, leftTo int }

// countNodes counts a record's nodes as the console's record page does.
// Until the forty-fourth hostile pass a node left to another termination
// was counted unaccounted: the record of a rogue's drain of its own child,
// which an operator's abort took over, read "1 unaccounted" and named no
// termination that accounts for it, where the console counted it apart.
func countNodes(r *tetherv1.ReconciliationRecord) nodeCounts {
	var c nodeCounts
	for _, n := range r.Nodes {
		switch n.Outcome {
		case tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED:
			c.confirmed++
		case tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED:
			c.leftTo++
		default:
			c.unaccounted++
		}
	}
	return c
}

func countRanOn(r *tetherv1.ReconciliationRecord) int {
	n := 0
	for _, c := range r.ToolCalls {
		if agentsdk.RanOnAfterCancel(c) {
			n++
		}
	}
	return n
}

// clockTime is a record's time of day, as the summary prints it; "never"
// when unset.
func clockTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "never"
	}
	return ts.AsTime().UTC().Format("15:04:05Z")
}

// leaseEnd says how a record's lease ended and on whose word: the
// holder's report (its claim, when it came while the holder was being
// stopped), the coordinator's resolution, the termination's (on the
// holder's claim, when it rests on a cancel acknowledgement the holder
// made while being stopped), or the lease's own deadline.
func leaseEnd(l *tetherv1.RecordLease) string {
	res := ""
	if l.TerminalResult != tetherv1.TerminalResult_TERMINAL_RESULT_UNSPECIFIED {
		res = ": " + lower(l.TerminalResult.String(), "TERMINAL_RESULT_")
	}
	switch l.EndedBy {
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_HOLDER_REPORT:
		if l.ClaimedUnderStop {
			return res + ", claimed by the holder " + printable(l.EndedByNodeId) + " while it was being stopped (its claim, not confirmed)"
		}
		return res + ", reported by the holder " + printable(l.EndedByNodeId)
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_COORDINATOR_RESOLUTION:
		if l.EndedByNodeId != "" {
			return res + ", resolved by its coordinator, agent " + printable(l.EndedByNodeId)
		}
		return res + ", resolved by its coordinator (an operator)"
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_TERMINATION:
		if l.ClaimedUnderStop {
			return res + ", ended by the termination on the holder's acknowledgement of the cancel while it was being stopped (its claim, not confirmed)"
		}
		return res + ", ended by the termination"
	case tetherv1.LeaseEndedBy_LEASE_ENDED_BY_LEASE_DEADLINE:
		return res + ", ended by the lease's own deadline"
	}
	return res
}

func lower(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

// PrintRecordSummary renders a record for people: what was in flight and
// how it ended, what was revoked or expired, who is confirmed and who is
// unaccounted.
func PrintRecordSummary(w io.Writer, r *tetherv1.ReconciliationRecord) {
	nodes := countNodes(r)
	esc := ""
	if r.Escalated {
		esc = ", escalated to abort"
	}
	fmt.Fprintf(w, "Reconciliation record %s (schema v%d)\n", r.RecordId, r.SchemaVersion)
	fmt.Fprintf(w, "  termination %s of %s, mode %s%s, requested by %s\n", r.TerminationId, r.NodeId, modeName(r.Mode), esc, r.RequestedBy)
	if r.Reason != "" {
		fmt.Fprintf(w, "  reason: %s\n", printable(r.Reason))
	}
	if sr := r.StopRule; sr != nil {
		fmt.Fprintf(w, "  stop rule %q (%s, set by %s): %s\n", sr.Name, sr.RuleId, sr.SetBy, printable(sr.Expression))
		printValues(w, sr.Values)
	}
	fmt.Fprintf(w, "  phases:")
	for _, p := range r.Phases {
		fmt.Fprintf(w, " %s %s;", p.Name, p.Duration.AsDuration().Round(1e6))
	}
	fmt.Fprintln(w)

	printTallied(w, "Tool calls in flight or refused during the termination", r.ToolCalls, func(c *tetherv1.RecordToolCall) (string, string) {
		res := lower(c.Resolution.String(), "CALL_RESOLUTION_")
		by := ""
		if c.AcknowledgedBy != "" {
			by = ", acknowledged by " + c.AcknowledgedBy
		} else if c.EndedBy != "" {
			by = ", ended by " + c.EndedBy
		}
		if agentsdk.RanOnAfterCancel(c) {
			res += " after its cancel"
			by += fmt.Sprintf(", ran on after its cancel (ordered %s, ended %s)", clockTime(c.CancelRequestedAt), clockTime(c.EndedAt))
		}
		if c.Error != "" {
			by += " (" + printable(c.Error) + ")"
		}
		return res, fmt.Sprintf("%-24s %-12s %-22s gate %s%s", res, c.Tool, c.NodeId, c.GateId, by)
	})
	for _, n := range r.Nodes {
		if n.RefusedCallsNotListed > 0 {
			fmt.Fprintf(w, "  and %d more calls of %s refused, counted and not listed\n", n.RefusedCallsNotListed, n.NodeId)
		}
	}
	printTallied(w, "Privileges", r.Privileges, func(p *tetherv1.RecordPrivilege) (string, string) {
		out := lower(p.Outcome.String(), "PRIVILEGE_OUTCOME_")
		extra := ""
		if p.Error != "" {
			extra = " (" + printable(p.Error) + ")"
		}
		return out, fmt.Sprintf("%-14s %-18s %-24s %s%s", out, p.Kind, printable(p.ExternalId), p.NodeId, extra)
	})

	if len(r.Leases) > 0 {
		fmt.Fprintf(w, "\nLeases (%d)\n", len(r.Leases))
		for _, l := range r.Leases {
			fmt.Fprintf(w, "  %-12s job %s gen %d holder %s%s\n", lower(l.Outcome.String(), "LEASE_OUTCOME_"), printableJob(l.JobId), l.LeaseGeneration, printable(l.HolderIdentity), leaseEnd(l))
		}
	}

	leftTo := ""
	if nodes.leftTo > 0 {
		leftTo = fmt.Sprintf(", %d left to other terminations", nodes.leftTo)
	}
	fmt.Fprintf(w, "\nNodes: %d confirmed, %d unaccounted%s\n", nodes.confirmed, nodes.unaccounted, leftTo)
	for _, n := range r.Nodes {
		claim := ""
		if n.ClaimedBy != "" {
			claim = ", claimed by " + printable(n.ClaimedBy)
		}
		switch n.Outcome {
		case tetherv1.NodeOutcome_NODE_OUTCOME_CONFIRMED:
			fmt.Fprintf(w, "  confirmed    %-16s %s by %s%s\n", n.Name, n.NodeId, printable(n.ConfirmedBy), claim)
			continue
		case tetherv1.NodeOutcome_NODE_OUTCOME_SUPERSEDED:
			// Not confirmed here, nor unaccounted here: the termination
			// it was left to accounts for it, and tells its end in its
			// record once it has one (it may still be stopping the node:
			// termination show says how far it is).
			if by := n.SupersededByTerminationId; by != "" {
				fmt.Fprintf(w, "  left to      %-16s %s by termination %s (tether termination show %s)%s\n", n.Name, n.NodeId, by, by, claim)
			} else {
				fmt.Fprintf(w, "  left to      %-16s %s by another termination%s\n", n.Name, n.NodeId, claim)
			}
			continue
		}
		seen := "never"
		if n.LastSeenAt != nil {
			seen = n.LastSeenAt.AsTime().Format("15:04:05Z")
		}
		fmt.Fprintf(w, "  UNACCOUNTED  %-16s %s last seen %s, held grants %v jobs %v%s\n", n.Name, n.NodeId, seen, n.HeldGrantIds, printableJobs(n.HeldJobIds), claim)
		if n.UnaccountedReason != "" {
			fmt.Fprintf(w, "               why: %s\n", printable(n.UnaccountedReason))
		}
		for _, c := range n.Contradictions {
			fmt.Fprintf(w, "               after the confirmation, %s: %s at %s\n", c.Kind, printable(c.Detail), c.At.AsTime().Format("15:04:05Z"))
		}
	}
}

// printTallied prints a section of the summary: its heading with the
// number of items, a line for each (line returns the item's category and
// its text), then how many items each category has.
func printTallied[T any](w io.Writer, heading string, items []T, line func(T) (category, text string)) {
	fmt.Fprintf(w, "\n%s (%d)\n", heading, len(items))
	byCategory := map[string]int{}
	for _, item := range items {
		category, text := line(item)
		byCategory[category]++
		fmt.Fprintf(w, "  %s\n", text)
	}
	fmt.Fprintf(w, "  totals: %s\n", countsLine(byCategory))
}

func countsLine(m map[string]int) string {
	return sortedmap.Join(m, "none", ", ", func(k string, n int) string { return fmt.Sprintf("%d %s", n, k) })
}

func newProposalCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "proposal", Short: "Stop proposals made by agents"}
	decide := func(approve bool) *cobra.Command {
		verb := "reject"
		if approve {
			verb = "approve"
		}
		var reason string
		c := &cobra.Command{
			Use:   verb + " ID",
			Short: strings.ToUpper(verb[:1]) + verb[1:] + " a stop proposal",
			Args:  cobra.ExactArgs(1),
			RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
				resp, err := c.Supervisor.DecideProposal(cmd.Context(), connect.NewRequest(&tetherv1.DecideProposalRequest{ProposalId: args[0], Approve: approve, Reason: reason}))
				if err != nil {
					return err
				}
				if approve {
					if err := carried("termination", "", "", resp.Msg.GetTermination().GetTerminationId() != ""); err != nil {
						return err
					}
				}
				if resp.Msg.Termination != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "approved: termination %s started\n", resp.Msg.Termination.TerminationId)
					return nil
				}
				fmt.Fprintln(cmd.OutOrStdout(), "rejected")
				return nil
			}),
		}
		c.Flags().StringVar(&reason, "reason", "", "why")
		return c
	}
	var node, token string
	var pending bool
	var limit int
	ls := &cobra.Command{
		Use:   "ls [--node NODE] [--pending] [--limit N] [--page-token T]",
		Short: "List stop proposals, a page at a time",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			// A page at a time, never every proposal: decided ones are
			// kept, and an agent proposing its stop again each time it is
			// rejected grows them without end.
			var props []*tetherv1.StopProposal
			for calls := 0; calls < recordsCalls && len(props) < limit; calls++ {
				req := &tetherv1.ListProposalsRequest{NodeId: node, PageToken: token, PageSize: int32(min(limit-len(props), 1000))}
				if pending {
					req.State = tetherv1.ProposalState_PROPOSAL_STATE_PENDING
				}
				resp, err := c.Supervisor.ListProposals(cmd.Context(), connect.NewRequest(req))
				if err != nil {
					return err
				}
				props = append(props, resp.Msg.Proposals...)
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			more := ""
			if token != "" {
				more = "… more: tether proposal ls --page-token " + token
				if node != "" {
					more += " --node " + node
				}
				if pending {
					more += " --pending"
				}
				if limit != recordsLimit {
					more += " --limit " + strconv.Itoa(limit)
				}
				if asJSON, _ := g.wantJSON(); asJSON {
					fmt.Fprintln(cmd.ErrOrStderr(), more)
					more = ""
				}
			}
			if err := printList(g, cmd.OutOrStdout(), props, "PROPOSAL\tNODE\tSTATE\tCONDITION\tREASON\tTERMINATION", func(p *tetherv1.StopProposal) []string {
				return []string{p.ProposalId, p.NodeId, lower(p.State.String(), "PROPOSAL_STATE_"), orDash(p.Condition), orDash(p.Reason), orDash(p.TerminationId)}
			}); err != nil || more == "" {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		}),
	}
	ls.Flags().IntVar(&limit, "limit", recordsLimit, "print at most this many proposals (1 to 10000)")
	ls.Flags().StringVar(&token, "page-token", "", "the next page's token, as the previous page printed it")
	ls.Flags().StringVar(&node, "node", "", "only this node's proposals (its pending ones are read from their own index)")
	ls.Flags().BoolVar(&pending, "pending", false, "only the proposals waiting for a decision, agents' and stop rules' (read from their own index)")
	cmd.AddCommand(ls, decide(true), decide(false))
	return cmd
}
