package main

import (
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newKeysCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "The signing keys behind every token (JWKS)"}
	var ahead time.Duration
	rotate := &cobra.Command{
		Use:   "rotate [--publish-ahead 5m]",
		Short: "Add a new signing key; old keys stay in JWKS until their last token expired (admin)",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Auth.RotateKeys(cmd.Context(), connect.NewRequest(&tetherv1.RotateKeysRequest{PublishAhead: durationpb.New(ahead)}))
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			k := resp.Msg.Key
			fmt.Fprintf(cmd.OutOrStdout(), "new key %s: in JWKS now, signs from %s\n", k.Kid, k.ActiveFrom.AsTime().Format(time.RFC3339))
			return printKeys(cmd.OutOrStdout(), resp.Msg.Keys)
		}),
	}
	rotate.Flags().DurationVar(&ahead, "publish-ahead", 5*time.Minute, "how long JWKS shows the new key before it signs (verifiers cache JWKS)")
	list := &cobra.Command{
		Use:   "ls",
		Short: "List the signing keys",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Auth.ListKeys(cmd.Context(), connect.NewRequest(&tetherv1.ListKeysRequest{}))
			if err != nil {
				return err
			}
			if done, err := printedAsJSONList(g, cmd.OutOrStdout(), resp.Msg.Keys); done || err != nil {
				return err
			}
			return printKeys(cmd.OutOrStdout(), resp.Msg.Keys)
		}),
	}
	cmd.AddCommand(rotate, list)
	return cmd
}

func printKeys(w io.Writer, keys []*tetherv1.SigningKeyInfo) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "KID\tSIGNING\tACTIVE FROM\tRETIRES AFTER")
	for _, k := range keys {
		retire := "-"
		if k.RetireAfter != nil {
			retire = k.RetireAfter.AsTime().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\n", k.Kid, k.Signing, k.ActiveFrom.AsTime().Format(time.RFC3339), retire)
	}
	return tw.Flush()
}
