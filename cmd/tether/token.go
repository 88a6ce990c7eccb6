package main

import (
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newTokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Operator tokens and capability tokens"}
	cmd.AddCommand(tokenCreate(g), newTokenRefreshCommand(g), newTokenIntrospectCommand(g))
	return cmd
}

func tokenCreate(g *globals) *cobra.Command {
	var role, subject string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create --role viewer|operator|security|admin [--ttl 24h] [--subject NAME]",
		Short: "Create an operator token (admins)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, ok := tetherv1.Role_value["ROLE_"+strings.ToUpper(role)]
			if !ok || r == 0 {
				return fmt.Errorf("--role %q: want viewer, operator, security or admin", role)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.auth.CreateToken(cmd.Context(), connect.NewRequest(&tetherv1.CreateTokenRequest{
				Role: tetherv1.Role(r), Ttl: durationpb.New(ttl), Subject: subject,
			}))
			if err != nil {
				return err
			}
			if asJSON, err := g.wantJSON(); err != nil {
				return err
			} else if asJSON {
				return printJSON(cmd.OutOrStdout(), resp.Msg)
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Msg.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s) expires %s\n", resp.Msg.TokenId, role, resp.Msg.ExpiresAt.AsTime().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "role: viewer, operator, security or admin")
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "lifetime")
	cmd.Flags().StringVar(&subject, "subject", "", "who the token is for (default: the role)")
	return cmd
}

func newWhoAmICommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the principal of the current token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.auth.WhoAmI(cmd.Context(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), resp.Msg)
		},
	}
}
