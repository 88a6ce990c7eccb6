package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newTokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Operator tokens and capability tokens"}
	cmd.AddCommand(tokenCreate(g), tokenList(g), tokenRevoke(g), tokenRotateAdmin(g), newTokenRefreshCommand(g), newTokenIntrospectCommand(g))
	return cmd
}

func tokenCreate(g *globals) *cobra.Command {
	var role, subject, toolServer string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create (--role viewer|operator|security|admin [--subject NAME] | --tool-server NAME) [--ttl 24h]",
		Short: "Create an operator token or a tool server's token (admins)",
		Long: "Create an operator token with a role, or, with --tool-server, the token a tool server (a ToolGate,\n" +
			"the MCP gateway) reports tool calls with. The tool server's name is its gate id in the ledger.\n" +
			"Every token has an id and an expiry: --ttl, or the server's default (tether serve --token-ttl, 24h).\n" +
			"`tether token list` shows it and `tether token revoke ID` stops it.",
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
			if ttl == 0 {
				req.Ttl = nil
			}
			resp, err := c.Auth.CreateToken(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			if err := carried("token", "", "", resp.Msg.Token != "" && resp.Msg.TokenId != ""); err != nil {
				return err
			}
			if done, err := g.printedAsAsked(cmd, resp.Msg); done || err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Msg.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s) expires %s\n", resp.Msg.TokenId, role, resp.Msg.ExpiresAt.AsTime().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "role: viewer, operator, security or admin")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default: the server's --token-ttl, 24h)")
	cmd.Flags().StringVar(&subject, "subject", "", "who the token is for (default: the role)")
	cmd.Flags().StringVar(&toolServer, "tool-server", "", "mint a tool server's token with this name (its gate id) instead of an operator token")
	addPrintFlag(cmd, "token", "token_id", "expires_at")
	return cmd
}

func tokenList(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "list [--all]",
		Short: "List the minted tokens, without their secrets (security, admins)",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Auth.ListTokens(cmd.Context(), connect.NewRequest(&tetherv1.ListTokensRequest{IncludeInactive: all}))
			if err != nil {
				return err
			}
			return printList(g, cmd.OutOrStdout(), resp.Msg.Tokens, "TOKEN ID\tPRINCIPAL\tROLE\tCREATED\tEXPIRES\tCREATED BY\tREVOKED", func(t *tetherv1.TokenInfo) []string {
				revoked := "-"
				if t.RevokedAt != nil {
					revoked = t.RevokedAt.AsTime().Format(time.RFC3339) + " by " + t.RevokedBy
				}
				return []string{t.TokenId, t.Principal, roleName(t.Role),
					t.CreatedAt.AsTime().Format(time.RFC3339), t.ExpiresAt.AsTime().Format(time.RFC3339), t.CreatedBy, revoked}
			})
		}),
	}
	cmd.Flags().BoolVar(&all, "all", false, "also list expired and revoked tokens")
	return cmd
}

func tokenRevoke(g *globals) *cobra.Command {
	var reason, tokenFile string
	cmd := &cobra.Command{
		Use:   "revoke ID [--reason TEXT] | revoke --token-value-file FILE",
		Short: "Revoke a minted token everywhere at once (security, admins)",
		Long: "Revoke a token by its id (tether token list): from the next call every replica refuses it,\n" +
			"whatever its expiry. --token-value-file revokes a token given by value instead (one minted\n" +
			"before tokens were recorded, such as an old admin.token).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &tetherv1.RevokeTokenRequest{Reason: reason}
			switch {
			case len(args) == 1 && tokenFile == "":
				req.TokenId = args[0]
			case len(args) == 0 && tokenFile != "":
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return err
				}
				req.Token = strings.TrimSpace(string(b))
			default:
				return fmt.Errorf("give a token id or --token-value-file, not both")
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Auth.RevokeToken(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			if err := carried("token", req.TokenId, resp.Msg.GetToken().GetTokenId(), resp.Msg.GetToken().GetTokenId() != ""); err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			if resp.Msg.AlreadyRevoked {
				fmt.Fprintf(cmd.OutOrStdout(), "token %s (%s) was already revoked\n", resp.Msg.Token.TokenId, resp.Msg.Token.Principal)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked token %s (%s); revocation feed sequence %d\n", resp.Msg.Token.TokenId, resp.Msg.Token.Principal, resp.Msg.Sequence)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (kept with the token's record)")
	cmd.Flags().StringVar(&tokenFile, "token-value-file", "", "file holding the token to revoke, instead of its id")
	return cmd
}

// tokenRotateAdmin replaces the admin token in one command: a new admin
// token is minted and written over the old file, then the old token is
// revoked (by value, so an admin.token from before tokens were recorded
// goes too).
func tokenRotateAdmin(g *globals) *cobra.Command {
	var out string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "rotate-admin [--out FILE] [--ttl 8760h]",
		Short: "Replace the admin token: mint a new one, write it, revoke the old one",
		Long: "Replace a leaked or old admin token in one step: with the current admin token (--token,\n" +
			"$TETHER_TOKEN, --token-file, or <data-dir>/admin.token), mint a new admin token, write it to\n" +
			"--out (default <data-dir>/admin.token, mode 0600, replaced atomically), then revoke the old\n" +
			"token everywhere. Other admin tokens are not touched: list them with `tether token list`.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				out = filepath.Join(g.dataDir, "admin.token")
			}
			old, err := g.resolveToken()
			if err != nil {
				return err
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			created, err := c.Auth.CreateToken(cmd.Context(), connect.NewRequest(&tetherv1.CreateTokenRequest{
				Role: tetherv1.Role_ROLE_ADMIN, Subject: "admin", Ttl: durationpb.New(ttl),
			}))
			if err != nil {
				return fmt.Errorf("mint the new admin token: %w", err)
			}
			if err := carried("token", "", "", created.Msg.Token != "" && created.Msg.TokenId != ""); err != nil {
				return fmt.Errorf("mint the new admin token (the old one is kept): %w", err)
			}
			tmp := out + ".tmp"
			if err := os.WriteFile(tmp, []byte(created.Msg.Token+"\n"), 0o600); err != nil {
				return fmt.Errorf("write the new admin token: %w", err)
			}
			if err := os.Rename(tmp, out); err != nil {
				return fmt.Errorf("write the new admin token: %w", err)
			}
			g.token = created.Msg.Token
			c, err = g.clients()
			if err != nil {
				return err
			}
			revoked, err := c.Auth.RevokeToken(cmd.Context(), connect.NewRequest(&tetherv1.RevokeTokenRequest{Token: old, Reason: "rotated (tether token rotate-admin)"}))
			if err != nil {
				return fmt.Errorf("the new admin token %s is in %s, but revoking the old one failed (revoke it with tether token revoke): %w", created.Msg.TokenId, out, err)
			}
			if err := carried("token", "", "", revoked.Msg.GetToken().GetTokenId() != ""); err != nil {
				return fmt.Errorf("the new admin token %s is in %s, but the old one's revocation was not confirmed (revoke it with tether token revoke): %w", created.Msg.TokenId, out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "new admin token %s written to %s (expires %s)\nold token %s revoked\n",
				created.Msg.TokenId, out, created.Msg.ExpiresAt.AsTime().Format(time.RFC3339), revoked.Msg.Token.TokenId)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "where to write the new admin token (default <data-dir>/admin.token)")
	cmd.Flags().DurationVar(&ttl, "ttl", 365*24*time.Hour, "lifetime of the new admin token")
	return cmd
}

func newWhoAmICommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Show the principal of the current token",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			resp, err := c.Auth.WhoAmI(cmd.Context(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
			if err != nil {
				return err
			}
			if done, err := g.printedAsAsked(cmd, resp.Msg); done || err != nil {
				return err
			}
			w := resp.Msg
			fmt.Fprintf(cmd.OutOrStdout(), "principal:   %s\nrole:        %s\nnode_id:     %s\nexpires_at:  %s\n",
				w.Principal, roleName(w.Role), orDash(w.NodeId), formatTimestamp(w.ExpiresAt))
			return nil
		}),
	}
	addPrintFlag(cmd, "principal", "node_id", "role", "expires_at")
	return cmd
}
