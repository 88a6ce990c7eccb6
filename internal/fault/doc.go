// Package fault gives every error a domain package returns one of a handful
// of categories, so the RPC edge can pick a status code without knowing the
// package that failed.
//
// A domain package (capability, supervisor, the lease coordinator, the
// store contract, …) declares its sentinels with New, in its own words and
// with its package prefix:
//
//	var ErrNodeNotFound = fault.New(fault.NotFound, "supervisor: node not found")
//
// and wraps them with context as before, with %w, so errors.Is still finds
// the sentinel and KindOf still finds its category:
//
//	return fmt.Errorf("%w: %s", ErrNodeNotFound, id)
//
// An error that needs no sentinel of its own (nobody tests for it with
// errors.Is) is made with Errorf, which takes the category first.
//
// The caller's duties:
//   - Pick the category from the caller's point of view: what may the
//     caller do about it (fix the request, look elsewhere, retry, stop)?
//     Internal is for a bug, corrupt data or a control signal that never
//     leaves the package; it is also what an error without a category is.
//   - Messages reach clients: they name fields, ids and limits in the
//     user's vocabulary and never contain a token, key or secret.
//   - A domain package never imports connect; the edge (controlplane's
//     toConnect) maps each Kind to one code, in one table. Answers that need
//     more than a code on the wire (a rate limit's Retry-After and RetryInfo)
//     are built at the edge, where the wire is known.
//
// When an error wraps several categorized errors (fmt.Errorf with two %w,
// errors.Join), KindOf takes the first non-Internal one in the order
// errors.Is walks the tree: the outer sentinel wins over the cause it
// wraps ("token rejected: token expired" is Denied, not Unauthenticated).
package fault
