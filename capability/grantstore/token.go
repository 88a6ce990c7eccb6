package grantstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/store"
)

// Introspect verifies a token and checks it against the stored grants and
// the tombstones: active or not, and why. A token that fails verification
// is inactive with the verification error as its reason; the returned
// error is only for a failure to read the store. It writes nothing. The
// verdict's Grant is the stored grant in its effective state. A token
// verified before is not verified again while its key is in the ring and
// it has not expired (verifiedTokens); the store is read every time.
func (s *Service) Introspect(ctx context.Context, token string) (capability.Claims, capability.Verdict, error) {
	now := s.cfg.Clock.Now()
	claims, err := s.verified.verify(s.verifier, token, s.cfg.Keys(), now)
	if err != nil {
		return capability.Claims{}, capability.Verdict{Reason: err.Error(), Err: err}, nil
	}
	var verdict capability.Verdict
	err = s.cfg.Store.View(ctx, func(tx store.ReadTxn) error {
		reads := newReader(tx)
		verdict = capability.Check(claims, s.tombstones, reads.grant, now)
		if verdict.GrantFound {
			verdict.Grant = effective(verdict.Grant, reads.grant, now)
		}
		return reads.failed()
	})
	if err != nil {
		return capability.Claims{}, capability.Verdict{}, err
	}
	return claims, verdict, nil
}

// CheckToken implements ledger.TokenChecker for the tool-call ledger:
// the token's signature and times, its grant and whole chain against the
// store and the tombstones, and the scope the call needs
// (capability.Allows). It returns the holder's node id and the grant id;
// with a token that verifies but whose grant (or chain) is revoked or
// expired in the store, it returns them with the error too: the ledger
// keeps the use of a dead credential as its holder's activity.
func (s *Service) CheckToken(ctx context.Context, token, requiredScope string) (nodeID, grantID string, err error) {
	if err := capability.ValidateScope(requiredScope); err != nil {
		return "", "", fmt.Errorf("%w: required scope: %w", ErrInvalidArgument, err)
	}
	claims, verdict, err := s.Introspect(ctx, token)
	if err != nil {
		return "", "", err
	}
	if !verdict.Active {
		return claims.HolderNodeID, claims.GrantID, verdict.Err
	}
	if !capability.Allows(claims.Scopes, requiredScope) {
		return "", "", fmt.Errorf("%w: grant %s does not allow scope %q", ErrScopeNotGranted, claims.GrantID, requiredScope)
	}
	return claims.HolderNodeID, claims.GrantID, nil
}

// HolderOf implements ledger.TokenChecker: CheckToken without a scope,
// for a tool server's report that it served the token's holder. A token
// past its expiry that verifies but for it is a dead credential too: its
// holder is returned with the expiry (capability.Verifier.VerifyHolder).
// Refused for its expiry, the report of a rogue that claimed its exit and
// outlived its token (no one renews a claimed node's) noted nothing, and
// its gateway served it unseen.
func (s *Service) HolderOf(ctx context.Context, token string) (nodeID, grantID string, err error) {
	claims, verdict, err := s.Introspect(ctx, token)
	if err != nil {
		return "", "", err
	}
	if !verdict.Active && errors.Is(verdict.Err, capability.ErrTokenExpired) && claims.HolderNodeID == "" {
		if dead, derr := s.verifier.VerifyHolder(token, s.cfg.Keys(), s.cfg.Clock.Now()); dead.HolderNodeID != "" {
			return dead.HolderNodeID, dead.GrantID, derr
		}
	}
	if !verdict.Active {
		return claims.HolderNodeID, claims.GrantID, verdict.Err
	}
	return claims.HolderNodeID, claims.GrantID, nil
}

// GrantUsableIn implements ledger.TokenChecker: it reads the grant CheckToken
// named, and its whole chain, again in tx, the transaction that begins the
// call, and refuses it when it (or an ancestor) is no longer active at
// now. A revocation acknowledged after CheckToken read the grant is then
// either seen here or conflicts with tx (both stores compare what tx
// read), so no call begins on a grant revoked before it.
func (s *Service) GrantUsableIn(tx store.ReadTxn, grantID string, now time.Time) error {
	reads := newReader(tx)
	g, ok := reads.grant(grantID)
	if err := reads.failed(); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: grant %s", capability.ErrUnknownGrant, grantID)
	}
	if err := prefetchGrants(tx, reads, g.Chain); err != nil {
		return err
	}
	if v := capability.CheckGrant(g, s.tombstones, reads.grant, now); !v.Active {
		if err := reads.failed(); err != nil {
			return err
		}
		return v.Err
	}
	return nil
}

// Plausible reports whether token could verify against the current keys
// without checking its signature (capability.Verifier.Plausible): a
// refusal it makes is one CheckToken would make, for a fraction of the
// work.
func (s *Service) Plausible(token string) bool {
	return s.verifier.Plausible(token, s.cfg.Keys(), s.cfg.Clock.Now())
}
