package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

func newGrantCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "grant",
		Short: "Capability grants: issue, delegate, revoke and inspect",
		Long: `Capability grants are delegated down the agent tree, narrowed at every step,
and revocable by any ancestor. Operators issue root grants; an agent delegates
from a grant it holds (run "grant delegate" with the agent's credential as
--token). Revoking a grant revokes everything derived from it.`,
	}
	cmd.AddCommand(grantRoot(g), grantDelegate(g), grantRevoke(g), grantShow(g), grantTree(g), grantList(g))
	return cmd
}

func grantRoot(g *globals) *cobra.Command {
	var holder string
	var scopes []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "root --holder NODE --scope SCOPE [--scope SCOPE] [--ttl 24h]",
		Short: "Issue a root grant to a node (operators)",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			req := &tetherv1.IssueRootRequest{HolderNodeId: holder, Scopes: scopes, Ttl: durationFlag(ttl)}
			resp, err := c.Capability.IssueRoot(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			return printIssued(g, cmd, resp.Msg)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&holder, "holder", "", "node that holds the grant")
	f.StringArrayVar(&scopes, "scope", nil, `scope (repeatable), e.g. tool:shell, tool:*, s3:read:bucket/prefix*`)
	f.DurationVar(&ttl, "ttl", 0, "grant lifetime (default 24h)")
	addPrintFlag(cmd, "grant_id", "token", "token_expires_at")
	return cmd
}

func grantDelegate(g *globals) *cobra.Command {
	var parent, holder string
	var scopes []string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "delegate --from GRANT --holder NODE --scope SCOPE [--scope SCOPE] [--ttl D]",
		Short: "Derive a narrower grant for a node below the holder (as the holding agent)",
		Long: `Derive a grant from one the calling agent holds, for a running node in its
subtree. The scopes must be covered by the parent's and the expiry may not pass
the parent's (no --ttl: the parent's expiry). Call it with the holder agent's
credential: --token or TETHER_TOKEN.`,
		Args: cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			req := &tetherv1.DelegateRequest{ParentGrantId: parent, HolderNodeId: holder, Scopes: scopes, Ttl: durationFlag(ttl)}
			resp, err := c.Capability.Delegate(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			return printIssued(g, cmd, resp.Msg)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&parent, "from", "", "the parent grant (held by the caller)")
	f.StringVar(&holder, "holder", "", "node that will hold the new grant")
	f.StringArrayVar(&scopes, "scope", nil, "scope (repeatable); each must be covered by a parent scope")
	f.DurationVar(&ttl, "ttl", 0, "lifetime (default: until the parent expires)")
	addPrintFlag(cmd, "grant_id", "token", "token_expires_at")
	return cmd
}

func grantRevoke(g *globals) *cobra.Command {
	var holder, subtree, issuedBefore, reason string
	cmd := &cobra.Command{
		Use:   "revoke [GRANT | --holder NODE | --subtree NODE | --issued-before TIME] [--reason TEXT]",
		Short: "Revoke a grant and everything derived from it, or in bulk",
		Long: `Revoke one grant (and with it its whole subtree), every grant a node holds
(--holder), every grant held in a node's subtree (--subtree), or every grant
issued before a time (--issued-before, RFC 3339; operators only). The caller
must be in the revoker set of every grant it revokes: an ancestor holder, the
issuing operator, or the security or admin role; an agent names only nodes of
its own subtree. One tombstone is written per top grant.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &tetherv1.RevokeRequest{Reason: reason}
			targets := 0
			if len(args) == 1 {
				req.Target, targets = &tetherv1.RevokeRequest_GrantId{GrantId: args[0]}, targets+1
			}
			if holder != "" {
				req.Target, targets = &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: holder}, targets+1
			}
			if subtree != "" {
				req.Target, targets = &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: subtree}, targets+1
			}
			if issuedBefore != "" {
				at, err := time.Parse(time.RFC3339Nano, issuedBefore)
				if err != nil {
					return fmt.Errorf("--issued-before %q: want an RFC 3339 time such as 2026-12-01T09:00:00Z", issuedBefore)
				}
				req.Target, targets = &tetherv1.RevokeRequest_IssuedBefore{IssuedBefore: timestamppb.New(at)}, targets+1
			}
			if targets != 1 {
				return errors.New("name exactly one target: a GRANT, --holder, --subtree or --issued-before")
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Capability.Revoke(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, id := range resp.Msg.AlreadyRevokedGrantIds {
				fmt.Fprintf(w, "already revoked %s (tether grant show %s says by whom)\n", id, id)
			}
			if n := resp.Msg.AlreadyRevokedNotListed; n > 0 {
				fmt.Fprintf(w, "and %d more grants already revoked, not listed\n", n)
			}
			if len(resp.Msg.RevokedGrantIds) == 0 {
				fmt.Fprintf(w, "nothing to revoke: already revoked or expired (feed at sequence %d)\n", resp.Msg.Sequence)
				return nil
			}
			for _, id := range resp.Msg.RevokedGrantIds {
				fmt.Fprintf(w, "revoked %s and everything derived from it\n", id)
			}
			fmt.Fprintf(w, "tombstones up to sequence %d\n", resp.Msg.Sequence)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&holder, "holder", "", "revoke every grant this node holds")
	f.StringVar(&subtree, "subtree", "", "revoke every grant held in this node's subtree")
	f.StringVar(&issuedBefore, "issued-before", "", "revoke every grant issued before this RFC 3339 time")
	f.StringVar(&reason, "reason", "", "why (kept with the grant and in the revocation feed)")
	return cmd
}

func grantShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show GRANT",
		Short: "Show one grant",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.Capability.GetGrant(cmd.Context(), connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: args[0]}))
			if err != nil {
				return err
			}
			if err := carried("grant", args[0], resp.Msg.GetGrant().GetGrantId(), resp.Msg.GetGrant().GetGrantId() != ""); err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg.Grant); done || err != nil {
				return err
			}
			printGrant(cmd.OutOrStdout(), resp.Msg.Grant)
			return nil
		}),
	}
}

func grantList(g *globals) *cobra.Command {
	var holder, subtree, derived, token string
	var limit int
	cmd := &cobra.Command{
		Use:   "ls [--holder NODE | --subtree NODE | --derived-from GRANT] [--limit N] [--page-token T]",
		Short: "List grants, a page at a time",
		Args:  cobra.NoArgs,
		RunE: g.dialed(func(cmd *cobra.Command, _ []string, c *clients) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			// A page at a time, never every grant: revoked grants are
			// kept, and an agent that delegates and revokes again and
			// again grows them as far as its budget pays for.
			grants, next, err := somePages(limit, recordsCalls, token, func(token string, size int32) ([]*tetherv1.Grant, string, error) {
				resp, err := c.Capability.ListGrants(cmd.Context(), connect.NewRequest(&tetherv1.ListGrantsRequest{HolderNodeId: holder, SubtreeNodeId: subtree, DerivedFromGrantId: derived, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.Grants, resp.Msg.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			more := nextPageLine(g, cmd, "tether grant ls", next, "--holder", holder, "--subtree", subtree, "--derived-from", derived, "--limit", limitFlag(limit, recordsLimit))
			if err := printList(g, cmd.OutOrStdout(), grants, "GRANT\tPARENT\tHOLDER\tSTATE\tSCOPES\tEXPIRES", func(gr *tetherv1.Grant) []string {
				return []string{gr.GrantId, orDash(gr.ParentGrantId), gr.HolderNodeId, grantState(gr), strings.Join(gr.Scopes, ","), formatTimestamp(gr.ExpiresAt)}
			}); err != nil || more == "" {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		}),
	}
	f := cmd.Flags()
	f.IntVar(&limit, "limit", recordsLimit, "print at most this many grants (1 to 10000)")
	f.StringVar(&token, "page-token", "", "the next page's token, as the previous page printed it")
	f.StringVar(&holder, "holder", "", "grants held by this node")
	f.StringVar(&subtree, "subtree", "", "grants held anywhere in this node's subtree")
	f.StringVar(&derived, "derived-from", "", "this grant and everything derived from it")
	return cmd
}

func grantTree(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "tree GRANT [--limit N]",
		Short: "Draw a grant's derivation tree with states",
		Long: `Draw a grant's derivation tree with states: at most --limit grants of it,
in id order. When it holds more, the last line is the command that lists
the rest (tether grant ls --derived-from GRANT --page-token ...).`,
		Args: cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			// A page at a time, never the whole derivation: revoked grants
			// are kept, and an agent that delegates from the grant and
			// revokes again and again grows it as far as its budget pays.
			grants, next, err := somePages(limit, recordsCalls, "", func(token string, size int32) ([]*tetherv1.Grant, string, error) {
				resp, err := c.Capability.ListGrants(cmd.Context(), connect.NewRequest(&tetherv1.ListGrantsRequest{DerivedFromGrantId: args[0], PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.Grants, resp.Msg.NextPageToken, nil
			})
			if err != nil {
				return err
			}
			more := nextPageLine(g, cmd, "tether grant ls", next, "--derived-from", args[0], "--limit", limitFlag(limit, recordsLimit))
			if done, err := printedAsJSONList(g, cmd.OutOrStdout(), grants); done || err != nil {
				return err
			}
			if err := drawGrantTree(cmd, c, args[0], grants); err != nil || more == "" {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), more)
			return err
		}),
	}
	cmd.Flags().IntVar(&limit, "limit", recordsLimit, "draw at most this many grants (1 to 10000)")
	return cmd
}

// drawGrantTree draws the grants derived from rootID, each with its
// holder, state and scopes. grants may be a page of the derivation (in id
// order, which is random): the root is read on its own when the page does
// not hold it, and a grant whose parent is not on the page is drawn below
// the root, naming its parent, so every grant read is drawn once.
func drawGrantTree(cmd *cobra.Command, c *clients, rootID string, grants []*tetherv1.Grant) error {
	var root *tetherv1.Grant
	read := map[string]bool{}
	for _, gr := range grants {
		read[gr.GrantId] = true
		if gr.GrantId == rootID {
			root = gr
		}
	}
	if root == nil {
		resp, err := c.Capability.GetGrant(cmd.Context(), connect.NewRequest(&tetherv1.GetGrantRequest{GrantId: rootID}))
		if err != nil {
			return err
		}
		root, read[rootID] = resp.Msg.Grant, true
	}
	children := map[string][]*tetherv1.Grant{}
	for _, gr := range grants {
		switch {
		case gr.GrantId == rootID:
		case read[gr.ParentGrantId]:
			children[gr.ParentGrantId] = append(children[gr.ParentGrantId], gr)
		default:
			children[rootID] = append(children[rootID], gr)
		}
	}
	label := func(gr *tetherv1.Grant) string {
		l := fmt.Sprintf("%s → %s [%s] %s", gr.GrantId, gr.HolderNodeId, grantState(gr), strings.Join(gr.Scopes, ","))
		if gr.GrantId != rootID && !read[gr.ParentGrantId] {
			l += " (under " + gr.ParentGrantId + ", not drawn)"
		}
		return l
	}
	drawTree(cmd.OutOrStdout(), root, func(gr *tetherv1.Grant) []*tetherv1.Grant {
		kids := children[gr.GrantId]
		sort.Slice(kids, func(i, j int) bool {
			if !kids[i].CreatedAt.AsTime().Equal(kids[j].CreatedAt.AsTime()) {
				return kids[i].CreatedAt.AsTime().Before(kids[j].CreatedAt.AsTime())
			}
			return kids[i].GrantId < kids[j].GrantId
		})
		return kids
	}, label)
	return nil
}

// grantState names a grant's state, and what revoked it when that was an
// ancestor.
func grantState(gr *tetherv1.Grant) string {
	state := strings.ToLower(strings.TrimPrefix(gr.State.String(), "GRANT_STATE_"))
	if gr.State == tetherv1.GrantState_GRANT_STATE_REVOKED && gr.RevokedVia != "" && gr.RevokedVia != gr.GrantId {
		state += " via " + gr.RevokedVia
	}
	return state
}

func formatTimestamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func printGrant(w io.Writer, gr *tetherv1.Grant) {
	fmt.Fprintf(w, "grant_id:    %s\nparent:      %s\nholder:      %s\nissuer:      %s\nscopes:      %s\nstate:       %s\nnot_before:  %s\nexpires_at:  %s\nchain:       %s\nrevokers:    %s\n",
		gr.GrantId, orDash(gr.ParentGrantId), gr.HolderNodeId, gr.Issuer, strings.Join(gr.Scopes, ", "), grantState(gr),
		formatTimestamp(gr.NotBefore), formatTimestamp(gr.ExpiresAt), orDash(strings.Join(gr.Chain, " → ")), strings.Join(gr.Revokers, ", "))
	if gr.State == tetherv1.GrantState_GRANT_STATE_REVOKED {
		fmt.Fprintf(w, "revoked:     %s by %s (%s)\n", formatTimestamp(gr.RevokedAt), orDash(gr.RevokedBy), printable(orDash(gr.Reason)))
	}
}

// issuedAnswer is the answer of a call that issues a grant: the grant and
// its first token.
type issuedAnswer interface {
	proto.Message
	GetGrant() *tetherv1.Grant
	GetToken() string
	GetTokenExpiresAt() *timestamppb.Timestamp
}

// printIssued prints the field --print names, or the grant with its fresh
// token: the token alone on the last line, so `| tail -1` captures it.
func printIssued(g *globals, cmd *cobra.Command, msg issuedAnswer) error {
	if err := carried("grant", "", "", msg.GetGrant().GetGrantId() != "" && msg.GetToken() != ""); err != nil {
		return err
	}
	if done, err := g.printedAsAsked(cmd, msg); done || err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	printGrant(w, msg.GetGrant())
	fmt.Fprintf(w, "token expires at %s:\n%s\n", formatTimestamp(msg.GetTokenExpiresAt()), msg.GetToken())
	return nil
}

func newTokenRefreshCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "refresh GRANT",
		Short: "Mint a fresh capability token for a grant, after re-checking its whole chain",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.Capability.Refresh(cmd.Context(), connect.NewRequest(&tetherv1.RefreshRequest{GrantId: args[0]}))
			if err != nil {
				return err
			}
			if err := carried("token", "", "", resp.Msg.Token != ""); err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), resp.Msg.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token for grant %s expires %s\n", resp.Msg.Grant.GetGrantId(), formatTimestamp(resp.Msg.TokenExpiresAt))
			return nil
		}),
	}
}

func newTokenIntrospectCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "introspect [TOKEN | -]",
		Short: "Say whether a capability token is active, and why (reads stdin with - or no argument)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			token := ""
			if len(args) == 1 && args[0] != "-" {
				token = args[0]
			} else {
				line, err := bufio.NewReader(io.LimitReader(cmd.InOrStdin(), 64<<10)).ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					return fmt.Errorf("read the token from stdin: %w", err)
				}
				token = strings.TrimSpace(line)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.Capability.Introspect(cmd.Context(), connect.NewRequest(&tetherv1.IntrospectRequest{Token: token}))
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			m := resp.Msg
			w := cmd.OutOrStdout()
			active := "no"
			if m.Active {
				active = "yes"
			}
			fmt.Fprintf(w, "active:   %s\nreason:   %s\n", active, printable(m.Reason))
			if m.HolderNodeId != "" {
				fmt.Fprintf(w, "holder:   %s\nscopes:   %s\nexpires:  %s\n", m.HolderNodeId, strings.Join(m.Scopes, ", "), formatTimestamp(m.ExpiresAt))
			}
			if m.Grant != nil {
				fmt.Fprintf(w, "grant:    %s [%s]\n", m.Grant.GrantId, grantState(m.Grant))
			}
			if !m.Active {
				return errInactive // scripts test the exit status
			}
			return nil
		},
	}
}

// errInactive makes `tether token introspect` exit non-zero for a token
// that is not active.
var errInactive = errors.New("token is not active")
