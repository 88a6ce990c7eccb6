package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newRolloutCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Replace agents in batches through drain and restart (docs/rollouts.md)",
	}
	cmd.AddCommand(newRolloutStartCommand(g), newRolloutStatusCommand(g), newRolloutListCommand(g),
		newRolloutDecisionCommand(g, "pause", "Stop starting new batches (started ones finish)"),
		newRolloutDecisionCommand(g, "resume", "Resume a paused rollout (unfinished batches get a fresh deadline)"),
		newRolloutDecisionCommand(g, "abort", "Stop the rollout for good (a draining batch's leases are reconciled, not handed over)"))
	return cmd
}

func newRolloutStartCommand(g *globals) *cobra.Command {
	var selector, target, description string
	var batch, maxUnavailable uint32
	var deadline, window, confirm time.Duration
	var wait bool
	cmd := &cobra.Command{
		Use:   "start --selector version=v1 --target version=v2 [--batch 5] [--max-unavailable 5] [--wait]",
		Short: "Start replacing the agents matching --selector with agents matching --target",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Supervisor.Rollout(cmd.Context(), connect.NewRequest(&tetherv1.RolloutRequest{
				Selector: selector, TargetSelector: target, Batch: batch, MaxUnavailable: maxUnavailable,
				BatchDeadline: durationpb.New(deadline), DrainWindow: durationpb.New(window), ConfirmTimeout: durationpb.New(confirm),
				Description: description,
			}))
			if err != nil {
				return err
			}
			if !wait {
				return printRollout(g, cmd.OutOrStdout(), "", resp.Msg.Rollout)
			}
			if err := carried("rollout", "", "", resp.Msg.GetRollout().GetRolloutId() != ""); err != nil {
				return err
			}
			return followRollout(g, cmd, c, resp.Msg.Rollout.RolloutId)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&selector, "selector", "", "the agents to replace, k=v[,k2=v2] (required)")
	f.StringVar(&target, "target", "", "what a replacement looks like, k=v[,k2=v2] (required)")
	f.Uint32Var(&batch, "batch", 1, "agents drained per batch (one termination and one record per batch)")
	f.Uint32Var(&maxUnavailable, "max-unavailable", 0, "at most this many agents drained and not yet replaced (default: --batch)")
	f.DurationVar(&deadline, "batch-deadline", 10*time.Minute, "a batch not replaced within this pauses the rollout")
	f.DurationVar(&window, "window", 30*time.Second, "each batch's drain window")
	f.DurationVar(&confirm, "confirm-timeout", 30*time.Second, "how long each batch waits for exit confirmations")
	f.StringVar(&description, "description", "", "why (kept in every batch's record)")
	f.BoolVar(&wait, "wait", false, "follow the rollout until it completes, pauses or is aborted")
	_ = cmd.MarkFlagRequired("selector")
	_ = cmd.MarkFlagRequired("target")
	return cmd
}

func newRolloutStatusCommand(g *globals) *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "status ID [--watch]",
		Short: "Show a rollout and its batches; --watch follows it live",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			if watch {
				return followRollout(g, cmd, c, args[0])
			}
			resp, err := c.Supervisor.GetRollout(cmd.Context(), connect.NewRequest(&tetherv1.GetRolloutRequest{RolloutId: args[0]}))
			if err != nil {
				return err
			}
			return printRollout(g, cmd.OutOrStdout(), args[0], resp.Msg.Rollout)
		}),
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "follow the rollout until it completes, pauses or is aborted")
	return cmd
}

func newRolloutListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List rollouts, newest first",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Supervisor.ListRollouts(cmd.Context(), connect.NewRequest(&tetherv1.ListRolloutsRequest{}))
			if err != nil {
				return err
			}
			return printList(g, cmd.OutOrStdout(), resp.Msg.Rollouts, "ROLLOUT\tSTATE\tSELECTOR\tTARGET\tBATCHES\tREMAINING\tCREATED", func(r *tetherv1.Rollout) []string {
				return []string{r.RolloutId, rolloutStateName(r.State), r.Selector, r.TargetSelector,
					fmt.Sprintf("%d/%d", r.GetCounts().GetBatchesDone(), len(r.Batches)), fmt.Sprint(r.GetCounts().GetRemaining()), r.CreatedAt.AsTime().Format(time.RFC3339)}
			})
		}),
	}
}

func newRolloutDecisionCommand(g *globals, verb, short string) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   verb + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			var decided interface{ GetRollout() *tetherv1.Rollout }
			var err error
			switch verb {
			case "pause":
				decided, err = answer(c.Supervisor.PauseRollout(cmd.Context(), connect.NewRequest(&tetherv1.PauseRolloutRequest{RolloutId: args[0], Reason: reason})))
			case "resume":
				decided, err = answer(c.Supervisor.ResumeRollout(cmd.Context(), connect.NewRequest(&tetherv1.ResumeRolloutRequest{RolloutId: args[0]})))
			case "abort":
				decided, err = answer(c.Supervisor.AbortRollout(cmd.Context(), connect.NewRequest(&tetherv1.AbortRolloutRequest{RolloutId: args[0], Reason: reason})))
			}
			if err != nil {
				return err
			}
			return printRollout(g, cmd.OutOrStdout(), args[0], decided.GetRollout())
		}),
	}
	if verb != "resume" {
		cmd.Flags().StringVar(&reason, "reason", "", "why (kept in the rollout)")
	}
	return cmd
}

// followRollout prints a progress line each time the rollout moves, until
// it completes, pauses or is aborted.
func followRollout(g *globals, cmd *cobra.Command, c *clients, id string) error {
	stream, err := c.Supervisor.WatchRollout(cmd.Context(), connect.NewRequest(&tetherv1.WatchRolloutRequest{RolloutId: id}))
	if err != nil {
		return err
	}
	defer stream.Close()
	w := cmd.OutOrStdout()
	var last *tetherv1.Rollout
	lastLine := ""
	for stream.Receive() {
		r := stream.Msg().Rollout
		if err := carried("rollout", id, r.GetRolloutId(), r.GetRolloutId() != ""); err != nil {
			return err
		}
		if last == nil {
			fmt.Fprintf(w, "rollout %s: %s → %s, batches of %d, at most %d unavailable\n", r.RolloutId, r.Selector, r.TargetSelector, r.Batch, r.MaxUnavailable)
		}
		if line := rolloutProgressLine(r); line != lastLine {
			fmt.Fprintln(w, line)
			lastLine = line
		}
		last = r
		if r.State != tetherv1.RolloutState_ROLLOUT_STATE_RUNNING {
			break
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if last == nil {
		return fmt.Errorf("rollout %s: the watch ended without an update", id)
	}
	fmt.Fprintf(w, "%s: %s\n", rolloutStateName(last.State), orDash(printable(last.Reason)))
	if last.State == tetherv1.RolloutState_ROLLOUT_STATE_PAUSED {
		fmt.Fprintf(w, "resume with: tether rollout resume %s\n", last.RolloutId)
	}
	return nil
}

func rolloutStateName(s tetherv1.RolloutState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ROLLOUT_STATE_"))
}

func batchStateName(s tetherv1.RolloutBatchState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ROLLOUT_BATCH_STATE_"))
}

func rolloutProgressLine(r *tetherv1.Rollout) string {
	cur := "-"
	if n := len(r.Batches); n > 0 {
		b := r.Batches[n-1]
		cur = fmt.Sprintf("batch %d %s", b.Index, batchStateName(b.State))
	}
	c := r.GetCounts()
	return fmt.Sprintf("  %-9s %-22s drained %d · replacements ready %d · unavailable %d · remaining %d · batches done %d · leases handed over %d",
		rolloutStateName(r.State), cur, c.GetDrained(), c.GetReplacementsReady(), c.GetUnavailable(), c.GetRemaining(), c.GetBatchesDone(), c.GetLeasesHandedOver())
}

// printRollout prints r, the answer's rollout, refused when it is not the
// one asked for (any, when asked is ""). Its reason is printable: a
// completed rollout's names the job ids of the leases it did not hand
// over, each its offerer's text (rogue47d).
func printRollout(g *globals, w io.Writer, asked string, r *tetherv1.Rollout) error {
	if err := carried("rollout", asked, r.GetRolloutId(), r.GetRolloutId() != ""); err != nil {
		return err
	}
	if done, err := g.printedAsJSON(w, r); done || err != nil {
		return err
	}
	fmt.Fprintf(w, "rollout_id:       %s\nstate:            %s\nreason:           %s\nselector:         %s\ntarget:           %s\nbatch:            %d (max unavailable %d, deadline %s)\nrequested_by:     %s\n%s\n",
		r.RolloutId, rolloutStateName(r.State), orDash(printable(r.Reason)), r.Selector, r.TargetSelector, r.Batch, r.MaxUnavailable,
		r.BatchDeadline.AsDuration(), r.RequestedBy, rolloutProgressLine(r))
	if len(r.Batches) == 0 {
		return nil
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "BATCH\tSTATE\tAGENTS\tTERMINATION\tRECORD\tLEASES MOVED\tNOT MOVED")
	for _, b := range r.Batches {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%d\n", b.Index, batchStateName(b.State), len(b.NodeIds), b.TerminationId, orDash(b.RecordId), b.LeasesHandedOver, len(b.LeasesNotHandedOver))
	}
	return tw.Flush()
}
