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

func newTerminateCommand(g *globals) *cobra.Command {
	var mode, reason string
	var window, ackTimeout, confirmTimeout time.Duration
	var wait bool
	cmd := &cobra.Command{
		Use:   "terminate NODE [--mode drain|abort] [--window 30s] [--wait]",
		Short: "Terminate a node's whole subtree through drain or abort",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, ok := map[string]tetherv1.TerminationMode{"drain": tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, "abort": tetherv1.TerminationMode_TERMINATION_MODE_ABORT}[mode]
			if !ok {
				return fmt.Errorf("--mode %q: want drain or abort", mode)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Supervisor.Terminate(cmd.Context(), connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: args[0], Mode: m, Reason: reason,
				DrainWindow: durationpb.New(window), CancelAckTimeout: durationpb.New(ackTimeout), ConfirmTimeout: durationpb.New(confirmTimeout),
			}))
			if err != nil {
				return err
			}
			t := resp.Msg.Termination
			if err := carried("termination", "", "", t.GetTerminationId() != ""); err != nil {
				return err
			}
			if !wait {
				if printed, err := printOneField(cmd, t); printed || err != nil {
					return err
				}
				return printTermination(g, cmd.OutOrStdout(), "", t)
			}
			// With --print, the progress goes to stderr, for the terminal,
			// and stdout carries only the field, for a shell variable.
			progress := cmd.OutOrStdout()
			if f := cmd.Flags().Lookup("print"); f.Value.String() != "" {
				progress = cmd.ErrOrStderr()
			}
			fmt.Fprintf(progress, "termination %s of %s (%s)\n", t.TerminationId, t.NodeId, strings.ToLower(strings.TrimPrefix(t.Mode.String(), "TERMINATION_MODE_")))
			stream, err := c.Supervisor.WatchTermination(cmd.Context(), connect.NewRequest(&tetherv1.WatchTerminationRequest{TerminationId: t.TerminationId}))
			if err != nil {
				return err
			}
			defer stream.Close()
			for stream.Receive() {
				asked := t.TerminationId
				t = stream.Msg().Termination
				if err := carried("termination", asked, t.GetTerminationId(), t.GetTerminationId() != ""); err != nil {
					return err
				}
				fmt.Fprintln(progress, progressLine(t))
				if t.State == tetherv1.TerminationState_TERMINATION_STATE_TERMINATED {
					break
				}
			}
			if err := stream.Err(); err != nil {
				return err
			}
			fmt.Fprintf(progress, "record %s (tether record show %s)\n", t.RecordId, t.RecordId)
			_, err = printOneField(cmd, t)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", "drain", "drain (let in-flight calls finish) or abort (cancel them)")
	f.DurationVar(&window, "window", 30*time.Second, "drain window before escalating to abort")
	f.DurationVar(&ackTimeout, "cancel-ack-timeout", 10*time.Second, "how long to wait for each cancel acknowledgement")
	f.DurationVar(&confirmTimeout, "confirm-timeout", 30*time.Second, "how long to wait for exit confirmations")
	f.StringVar(&reason, "reason", "", "why (kept in the record)")
	f.BoolVar(&wait, "wait", false, "follow the termination until it is terminated")
	addPrintFlag(cmd, "termination_id", "record_id", "state")
	return cmd
}

func stateName(s tetherv1.TerminationState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TERMINATION_STATE_"))
}

func progressLine(t *tetherv1.Termination) string {
	p := t.GetProgress()
	esc := ""
	if t.Escalated {
		esc = " (escalated to abort)"
	}
	return fmt.Sprintf("  %-12s nodes %d/%d marked · calls in flight %d · acks pending %d · confirmed %d/%d%s",
		stateName(t.State), p.GetNodesMarked(), p.GetNodesTotal(), p.GetCallsInFlight(), p.GetAcksPending(), p.GetConfirmations(), p.GetNodesTotal(), esc)
}

// printTermination prints t, the answer's termination, refused when it is
// not the one asked for (any, when asked is "").
func printTermination(g *globals, w io.Writer, asked string, t *tetherv1.Termination) error {
	if err := carried("termination", asked, t.GetTerminationId(), t.GetTerminationId() != ""); err != nil {
		return err
	}
	if done, err := g.printedAsJSON(w, t); done || err != nil {
		return err
	}
	fmt.Fprintf(w, "termination_id: %s\nnode_id:        %s\nmode:           %s\nstate:          %s\nrequested_by:   %s\nrecord_id:      %s\n%s\n",
		t.TerminationId, t.NodeId, strings.ToLower(strings.TrimPrefix(t.Mode.String(), "TERMINATION_MODE_")), stateName(t.State), t.RequestedBy, orDash(t.RecordId), progressLine(t))
	return nil
}

func newTerminationCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "termination", Short: "Inspect terminations"}
	cmd.AddCommand(&cobra.Command{
		Use:   "show ID",
		Short: "Show a termination",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.Supervisor.GetTermination(cmd.Context(), connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: args[0]}))
			if err != nil {
				return err
			}
			return printTermination(g, cmd.OutOrStdout(), args[0], resp.Msg.Termination)
		}),
	})
	return cmd
}
