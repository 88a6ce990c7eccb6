package controlplane

import (
	"context"
	"errors"
	"regexp"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/capability/grantstore"
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor"
	"github.com/tetherhq/tether/supervisor/lease"
	"github.com/tetherhq/tether/supervisor/lease/coordinator"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/privilege"
	"github.com/tetherhq/tether/supervisor/stoprule"
	"github.com/tetherhq/tether/supervisor/tree"
)

// errInvalid marks request validation failures made at the edge.
var errInvalid = errors.New("invalid argument")

// toConnect maps package sentinels to Connect codes at the edge. It is the
// one place that decides codes; an errors.Is switch (not a map keyed by
// error identity) so wrapped errors map correctly. Messages reach clients, so
// the packages keep secrets out of them.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errInvalid), errors.Is(err, tree.ErrInvalidArgument),
		errors.Is(err, coordinator.ErrInvalidArgument), errors.Is(err, lease.ErrInvalidMessage):
		code = connect.CodeInvalidArgument
	case errors.Is(err, coordinator.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, coordinator.ErrPrecondition):
		code = connect.CodeAborted
	case errors.Is(err, coordinator.ErrStopped), errors.Is(err, coordinator.ErrCommit):
		code = connect.CodeUnavailable
	case errors.Is(err, tree.ErrNodeNotFound), errors.Is(err, store.ErrNotFound),
		errors.Is(err, ledger.ErrCallNotFound), errors.Is(err, supervisor.ErrTerminationNotFound),
		errors.Is(err, supervisor.ErrRecordNotFound), errors.Is(err, supervisor.ErrProposalNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, tree.ErrParentNotRunning), errors.Is(err, tree.ErrNodeStopping),
		errors.Is(err, tree.ErrNodeExited),
		errors.Is(err, supervisor.ErrAlreadyStopping), errors.Is(err, supervisor.ErrProposalDecided):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, ledger.ErrWrongGate), errors.Is(err, privilege.ErrHookNotAllowed):
		code = connect.CodePermissionDenied
	case errors.Is(err, ledger.ErrTokenRejected):
		code = connect.CodePermissionDenied
	// The capability tree: the pure core's sentinels and grantstore's.
	case errors.Is(err, grantstore.ErrInvalidArgument), errors.Is(err, capability.ErrInvalidGrant),
		errors.Is(err, capability.ErrInvalidScope), errors.Is(err, capability.ErrInvalidTTL),
		errors.Is(err, capability.ErrExpiryExceedsParent), errors.Is(err, capability.ErrChainTooDeep):
		code = connect.CodeInvalidArgument
	case errors.Is(err, capability.ErrUnknownGrant):
		code = connect.CodeNotFound
	case errors.Is(err, capability.ErrScopeEscalation), errors.Is(err, capability.ErrNotInSubtree),
		errors.Is(err, capability.ErrNotHolder), errors.Is(err, capability.ErrNotRevoker),
		errors.Is(err, grantstore.ErrNotVisible), errors.Is(err, grantstore.ErrOperatorOnly),
		errors.Is(err, grantstore.ErrAgentOnly), errors.Is(err, grantstore.ErrScopeNotGranted):
		code = connect.CodePermissionDenied
	case errors.Is(err, capability.ErrGrantRevoked), errors.Is(err, capability.ErrGrantExpired),
		errors.Is(err, capability.ErrGrantNotYetValid), errors.Is(err, grantstore.ErrNodeNotRunning):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, grantstore.ErrContended):
		code = connect.CodeAborted
	case errors.Is(err, capability.ErrFeedStale), errors.Is(err, grantstore.ErrStopped):
		code = connect.CodeUnavailable
	case errors.Is(err, capability.ErrTokenTooLarge), errors.Is(err, capability.ErrTokenMalformed),
		errors.Is(err, capability.ErrTokenAlgorithm), errors.Is(err, capability.ErrTokenSignature),
		errors.Is(err, capability.ErrTokenIssuer), errors.Is(err, capability.ErrTokenAudience),
		errors.Is(err, capability.ErrTokenExpired), errors.Is(err, capability.ErrTokenNotYetValid),
		errors.Is(err, capability.ErrTokenClaims), errors.Is(err, capability.ErrUnknownKey):
		code = connect.CodeUnauthenticated
	case errors.Is(err, stoprule.ErrInvalidRule), errors.Is(err, stoprule.ErrOverBudget):
		code = connect.CodeInvalidArgument
	case errors.Is(err, stoprule.ErrDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, stoprule.ErrRuleNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, stoprule.ErrDuplicate):
		code = connect.CodeAlreadyExists
	case errors.Is(err, stoprule.ErrLimit):
		code = connect.CodeResourceExhausted
	case errors.Is(err, tree.ErrLimit), errors.Is(err, store.ErrTooLarge):
		code = connect.CodeResourceExhausted
	case errors.Is(err, auth.ErrDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, auth.ErrNoCredential), errors.Is(err, auth.ErrBadCredential), errors.Is(err, auth.ErrRevoked):
		code = connect.CodeUnauthenticated
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, store.ErrClosed):
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}

// invalid builds an InvalidArgument error whose message names the field.
func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, errorf(format, args...))
}

// denied builds a PermissionDenied error.
func denied(format string, args ...any) error {
	return connect.NewError(connect.CodePermissionDenied, errorf(format, args...))
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
