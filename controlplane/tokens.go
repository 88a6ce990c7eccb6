package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// Minted tokens: every token the control plane mints for its own API
// through CreateToken (whatever its kind) and the bootstrap admin token is
// recorded under tokenPrefix — its id, principal, role, creation and
// expiry, never the token — so that `tether token list` can show the live
// ones and `tether token revoke ID` can stop one. A revocation is a
// tombstone in the revocation feed (grantstore.RevokeBearer), the same
// durable path as a grant's; the interceptor consults this replica's
// tombstone set on every call, so a revoked token is refused on the next
// call, cached or not. Agent credentials are not recorded: they die with
// their node (tether terminate), and the session refreshes them.

const tokenPrefix = "auth/tokens/"

func tokenKey(id string) []byte { return []byte(tokenPrefix + id) }

// tokenKind is the kind of principal a token authenticates: the part of
// its id before the colon ("operator", "agent", …).
func tokenKind(p auth.Principal) string {
	kind, _, _ := strings.Cut(p.ID(), ":")
	return kind
}

// recordToken stores the record of a token just minted; createdBy is the
// minting principal, or "bootstrap".
func (s *Server) recordToken(ctx context.Context, token, createdBy string) (*tetherv1.TokenInfo, error) {
	now := s.cfg.Clock.Now()
	p, err := s.issuer.Parse(token, now)
	if err != nil {
		return nil, fmt.Errorf("controlplane: a token just minted does not parse: %w", err)
	}
	info := &tetherv1.TokenInfo{
		TokenId: p.TokenID, Principal: p.ID(), Kind: tokenKind(p), Role: roleToProto(p.Role),
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(p.ExpiresAt), CreatedBy: createdBy,
	}
	raw, err := proto.Marshal(info)
	if err != nil {
		return nil, err
	}
	err = s.store.Update(ctx, func(tx store.Txn) error { return tx.Put(tokenKey(p.TokenID), raw) })
	return info, err
}

func getTokenInfo(tx store.ReadTxn, id string) (*tetherv1.TokenInfo, error) {
	raw, err := tx.Get(tokenKey(id))
	if err != nil {
		return nil, err
	}
	return decodeTokenInfo(id, raw)
}

// decodeTokenInfo decodes the record raw of the token id.
func decodeTokenInfo(id string, raw []byte) (*tetherv1.TokenInfo, error) {
	info := &tetherv1.TokenInfo{}
	if err := proto.Unmarshal(raw, info); err != nil {
		return nil, fmt.Errorf("controlplane: token record %s does not decode: %w", id, err)
	}
	return info, nil
}

// tokenRevoked is the interceptor's revocation check: this replica's
// tombstone set, and, while its feed does not follow the store (its watch
// fell behind and it rescans), the token's record too, which RevokeToken
// marks in the transaction of the tombstone (a token revoked by value
// included): a replica whose feed watch ended behind served, until its
// rescan, a token another replica had revoked (rogue44i test). One read
// of one key per call while the feed rescans; none otherwise.
func (s *Server) tokenRevoked(ctx context.Context, tokenID string) (bool, error) {
	revoked, err := s.grants.BearerRevoked(ctx, tokenID)
	if err != nil || revoked || s.grants.FeedFollowing() {
		return revoked, err
	}
	return s.tokenRecordRevoked(ctx, tokenID)
}

// tokenRecordRevoked reads, from the store, whether the token's record
// says it was revoked (a token without a record was not).
func (s *Server) tokenRecordRevoked(ctx context.Context, tokenID string) (revoked bool, err error) {
	err = s.store.View(ctx, func(tx store.ReadTxn) error {
		info, err := getTokenInfo(tx, tokenID)
		if errors.Is(err, store.ErrNotFound) {
			revoked = false
			return nil
		}
		if err != nil {
			return err
		}
		revoked = info.RevokedAt != nil
		return nil
	})
	return revoked, err
}

// asCaller is p as the tree's Caller of a spawn or a root's registration:
// its token's record (when it has an id) is read in the transaction that
// writes the node, and a revoked one is refused unauthenticated, as
// mintableBy refuses a mint. An agent credential's record is written by
// its revocation alone (Unrecorded): it is expected absent, a comparison
// in the commit on etcd and no read; an operator's is read beside the
// parent's keys of a spawn (the same round trip on etcd), and is a read
// of its own for a root's registration, which read nothing before.
// The call was admitted on this replica's tombstone set, which may not
// hold yet a revocation another replica acknowledged: a node written then
// came with a credential of its own line, which the revocation never
// named, served on every replica and refreshed by its session for as long
// as the node ran (rogue48c tests). Checked in the node's transaction, a
// revocation committed between the read and the write makes the write
// conflict, and it is read again.
func asCaller(p auth.Principal) tree.Caller {
	c := tree.Caller{ID: p.ID()}
	if p.TokenID == "" {
		return c
	}
	c.Standing, c.Unrecorded = tokenKey(p.TokenID), p.IsAgent()
	c.Refuse = func(raw []byte) error {
		if raw == nil {
			return nil
		}
		info, err := decodeTokenInfo(p.TokenID, raw)
		if err != nil {
			return err
		}
		if info.RevokedAt != nil {
			return errTokenRevoked(p.TokenID)
		}
		return nil
	}
	return c
}

// errTokenRevoked is the refusal of a call whose token's record says it
// was revoked.
func errTokenRevoked(tokenID string) error {
	return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%w: token %s was revoked", auth.ErrRevoked, tokenID))
}

// refreshAgent mints the fresh credential a session or a heartbeat hands
// out in place of p's, of its line (auth.Interceptor.RefreshAgent), now
// being the caller's reading before this one, once the line's record says
// it is not revoked (mintableBy). The call was admitted on this replica's
// tombstone set, which follows the store as fast as its feed does: on a
// replica whose feed heard of a revocation taken on another a few seconds
// late, a refresh in between minted a credential of the revoked line
// after the revocation was acknowledged, which outlived its tombstone
// (that lives a credential's lifetime and a leeway from its commit) and,
// refreshed again once the tombstone had dropped, began the line anew for
// as long as the node ran (rogue47a test).
func (s *Server) refreshAgent(ctx context.Context, p auth.Principal, now time.Time) (token string, exp time.Time, err error) {
	if err := s.mintableBy(ctx, p); err != nil {
		return "", time.Time{}, err
	}
	return s.authn.RefreshAgent(p, now, s.cfg.AgentCredentialTTL)
}

// mintableBy refuses, unauthenticated, a caller whose token's record says
// it was revoked, read from the store: a token is minted for a caller
// (a refreshed credential, CreateToken's) only then. The call was
// admitted on this replica's tombstone set, which may not hold yet a
// revocation another replica acknowledged (its feed's watch delivers it
// late), and what is minted then outlives that revocation: a revoked
// agent credential's line begun anew, a revoked admin token's successor
// (rogue47a tests). The record is written in the transaction of the
// tombstone (RevokeToken); one read of one key a mint. A token without an
// id has no record to read.
func (s *Server) mintableBy(ctx context.Context, p auth.Principal) error {
	if p.TokenID == "" {
		return nil
	}
	revoked, err := s.tokenRecordRevoked(ctx, p.TokenID)
	if err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("auth: cannot check the token's revocation: %w", err))
	}
	if revoked {
		return errTokenRevoked(p.TokenID)
	}
	return nil
}

// tombstonePublished is the grant store's OnPublish: the metrics, and,
// for a bearer token's revocation (a tombstone naming no holder), the end
// of every agent's stream opened with it here that sent nothing since
// (auth.Interceptor.EndRevokedStreams; one that sends is refused at its
// next message): a session held open without a heartbeat, a signals
// stream, outlived its credential's revocation (rogue45b test).
func (s *Server) tombstonePublished(t capability.Tombstone) {
	s.metrics.published(t)
	if t.Holder == "" && t.Lineage == "" && s.authn != nil {
		s.authn.EndRevokedStreams(t.GrantID)
	}
}

var errAlreadyRevoked = errors.New("token already revoked")

// RevokeToken revokes a minted token (see auth.proto).
func (a *authService) RevokeToken(ctx context.Context, req *connect.Request[tetherv1.RevokeTokenRequest]) (*connect.Response[tetherv1.RevokeTokenResponse], error) {
	caller, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	reason := req.Msg.Reason
	if len(reason) > capability.MaxReasonBytes || !utf8.ValidString(reason) {
		return nil, invalid("reason must be valid UTF-8 of at most %d bytes", capability.MaxReasonBytes)
	}
	if (req.Msg.TokenId == "") == (req.Msg.Token == "") {
		return nil, invalid("exactly one of token_id and token is required")
	}
	id := req.Msg.TokenId
	var fromToken *tetherv1.TokenInfo // a token revoked by value, maybe never recorded
	if req.Msg.Token != "" {
		p, err := a.s.issuer.ParseAnyTime(req.Msg.Token)
		if err != nil {
			return nil, invalid("token: %v", err)
		}
		if p.TokenID == "" {
			return nil, invalid("token: it has no id (jti), so it cannot be revoked by id; rotate the signing keys (tether keys rotate) to end it")
		}
		id = p.TokenID
		fromToken = &tetherv1.TokenInfo{
			TokenId: p.TokenID, Principal: p.ID(), Kind: tokenKind(p), Role: roleToProto(p.Role),
			ExpiresAt: timestamppb.New(p.ExpiresAt), CreatedBy: "unrecorded",
		}
	} else if err := capability.ValidateID("token_id", id); err != nil {
		if strings.Count(id, ".") == 2 {
			// A token pasted where its id goes: say so, without a word of it.
			return nil, invalid("token_id holds a token, not its id: pass the id (tether token list), or the token itself in token (tether token revoke --token-value-file FILE)")
		}
		return nil, invalid("%s", strings.TrimPrefix(err.Error(), capability.ErrInvalidGrant.Error()+": "))
	}
	var info *tetherv1.TokenInfo
	err = a.s.store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		info, err = getTokenInfo(tx, id)
		if errors.Is(err, store.ErrNotFound) && fromToken != nil {
			info, err = fromToken, nil
		}
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("token_id %s is not a token this control plane recorded (tether token list); to revoke an older token, pass the token itself (tether token revoke --token-value-file FILE)", id))
	}
	if err != nil {
		return nil, toConnect(err)
	}
	if info.RevokedAt != nil {
		return connect.NewResponse(&tetherv1.RevokeTokenResponse{Token: info, AlreadyRevoked: true}), nil
	}
	// An agent's credential is one line with every credential its
	// sessions refreshed from it, of its id (auth.Interceptor.RefreshAgent):
	// the tombstone lives until the last of them minted before the
	// revocation may expire, not only the one revoked.
	var reminted time.Duration
	if info.Kind == "agent" {
		reminted = a.s.cfg.AgentCredentialTTL
	}
	var written *tetherv1.TokenInfo
	seq, err := a.s.grants.RevokeBearer(ctx, id, info.ExpiresAt.AsTime(), reminted, auth.Leeway, reason, func(tx store.Txn, at time.Time) error {
		current, err := getTokenInfo(tx, id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			current = proto.Clone(info).(*tetherv1.TokenInfo)
		case err != nil:
			return err
		case current.RevokedAt != nil:
			written = current
			return errAlreadyRevoked
		}
		current.RevokedAt, current.RevokedBy, current.RevokeReason = timestamppb.New(at), caller.ID(), reason
		raw, err := proto.Marshal(current)
		if err != nil {
			return err
		}
		written = current
		return tx.Put(tokenKey(id), raw)
	})
	if errors.Is(err, errAlreadyRevoked) {
		return connect.NewResponse(&tetherv1.RevokeTokenResponse{Token: written, AlreadyRevoked: true}), nil
	}
	if err != nil {
		return nil, toConnect(err)
	}
	a.s.log.Info("token revoked", "by", caller.ID(), "token_id", id, "principal", written.Principal)
	return connect.NewResponse(&tetherv1.RevokeTokenResponse{Token: written, Sequence: seq}), nil
}

// ListTokens lists the recorded tokens, live ones only unless asked.
func (a *authService) ListTokens(ctx context.Context, req *connect.Request[tetherv1.ListTokensRequest]) (*connect.Response[tetherv1.ListTokensResponse], error) {
	now := a.s.cfg.Clock.Now()
	var out []*tetherv1.TokenInfo
	err := a.s.store.View(ctx, func(tx store.ReadTxn) error {
		out = out[:0]
		return tx.Scan([]byte(tokenPrefix), nil, func(k, v []byte) error {
			info := &tetherv1.TokenInfo{}
			if err := proto.Unmarshal(v, info); err != nil {
				return fmt.Errorf("controlplane: token record %s does not decode: %w", k, err)
			}
			live := info.RevokedAt == nil && now.Before(info.ExpiresAt.AsTime().Add(auth.Leeway))
			if live || req.Msg.IncludeInactive {
				out = append(out, info)
			}
			return nil
		})
	})
	if err != nil {
		return nil, toConnect(err)
	}
	slices.SortFunc(out, func(a, b *tetherv1.TokenInfo) int {
		if c := a.CreatedAt.AsTime().Compare(b.CreatedAt.AsTime()); c != 0 {
			return c
		}
		return strings.Compare(a.TokenId, b.TokenId)
	})
	return connect.NewResponse(&tetherv1.ListTokensResponse{Tokens: out}), nil
}
