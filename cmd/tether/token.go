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
	var role, subject, toolServer string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create (--role viewer|operator|security|admin [--subject NAME] | --tool-server NAME) [--ttl 24h]",
		Short: "Create an operator token or a tool server's token (admins)",
		Long: "Create an operator token with a role, or, with --tool-server, the token a tool server (a ToolGate,\n" +
			"the MCP gateway) reports tool calls with. The tool server's name is its gate id in the ledger.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &tetherv1.CreateTokenRequest{Ttl: durationpb.New(ttl), Subject: subject, ToolServer: toolServer}
			switch {
			case toolServer != "" && role != "":
				return fmt.Errorf("--role and --tool-server are exclusive: a token is an operator's or a tool server's")
			case toolServer != "":
				role = "tool server"
			default:
				r, ok := tetherv1.Role_value["ROLE_"+strings.ToUpper(role)]
				if !ok || r == 0 {
					return fmt.Errorf("--role %q: want viewer, operator, security or admin (or --tool-server NAME)", role)
				}
				req.Role = tetherv1.Role(r)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.auth.CreateToken(cmd.Context(), connect.NewRequest(req))
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
	cmd.Flags().StringVar(&toolServer, "tool-server", "", "mint a tool server's token with this name (its gate id) instead of an operator token")
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
