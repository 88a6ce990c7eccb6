package controlplane

import (
	"context"
	"errors"
	"regexp"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/controlplane/store"
	"github.com/tetherhq/tether/supervisor"
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
	case errors.Is(err, errInvalid), errors.Is(err, supervisor.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, supervisor.ErrNodeNotFound), errors.Is(err, store.ErrNotFound),
		errors.Is(err, supervisor.ErrCallNotFound), errors.Is(err, supervisor.ErrTerminationNotFound),
		errors.Is(err, supervisor.ErrRecordNotFound), errors.Is(err, supervisor.ErrProposalNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, supervisor.ErrParentNotRunning), errors.Is(err, supervisor.ErrNodeStopping),
		errors.Is(err, supervisor.ErrAlreadyStopping), errors.Is(err, supervisor.ErrProposalDecided):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, supervisor.ErrWrongGate):
		code = connect.CodePermissionDenied
	case errors.Is(err, supervisor.ErrTokenRejected):
		code = connect.CodePermissionDenied
	case errors.Is(err, supervisor.ErrLimit), errors.Is(err, store.ErrTooLarge):
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
