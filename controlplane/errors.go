package controlplane

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/internal/fault"
)

// codeOf is the one table from an error's category (internal/fault) to its
// Connect code. The domain packages declare each sentinel's category; they
// never see a code.
var codeOf = [...]connect.Code{
	fault.Internal:        connect.CodeInternal,
	fault.Invalid:         connect.CodeInvalidArgument,
	fault.NotFound:        connect.CodeNotFound,
	fault.Exists:          connect.CodeAlreadyExists,
	fault.Conflict:        connect.CodeAborted,
	fault.Precondition:    connect.CodeFailedPrecondition,
	fault.Denied:          connect.CodePermissionDenied,
	fault.Unauthenticated: connect.CodeUnauthenticated,
	fault.Exhausted:       connect.CodeResourceExhausted,
	fault.Unavailable:     connect.CodeUnavailable,
}

// toConnect gives err its Connect code at the edge: an error that already
// is a Connect error (built here with details, such as a rate limit's
// RetryInfo) keeps its code; a cancelled or timed-out context keeps its
// meaning; everything else gets the code of its category. Messages reach
// clients, so the packages keep secrets out of them.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	if k := fault.KindOf(err); int(k) < len(codeOf) {
		code = codeOf[k]
	}
	if code == connect.CodeInternal {
		switch {
		case errors.Is(err, context.Canceled):
			code = connect.CodeCanceled
		case errors.Is(err, context.DeadlineExceeded):
			code = connect.CodeDeadlineExceeded
		}
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

// errorf formats a refusal. Its string arguments are the caller's own
// text quoted back to it (an id it named, which a rogue can make 90 KB
// long, or fill with a line break, an escape sequence or a right-to-left
// override): each is cut to maxQuoted bytes and its control characters
// and bidirectional overrides are escaped, so that a refusal carries
// neither a megabyte nor a forged line into a client's terminal or log.
func errorf(format string, args ...any) error {
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = quotable(s)
		}
	}
	return fmt.Errorf(format, args...)
}

const maxQuoted = 128

func quotable(s string) string {
	unsafe := func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }
	if len(s) <= maxQuoted && strings.IndexFunc(s, unsafe) < 0 {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		if i >= maxQuoted {
			b.WriteString("…")
			break
		}
		if r == utf8.RuneError || unsafe(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
