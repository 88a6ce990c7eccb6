// Package privilege is the registry of temporary privileges a node holds
// outside Tether (a file lock, a queue reservation, a cloud credential)
// and their revocation: an in-process revoker by kind, or a webhook per
// privilege. A termination revokes its members' privileges (Dispatch) and
// its record lists each outcome; the record's transaction decides, at the
// deadline, those that never answered (revoke_failed). A privilege past its
// declared expiry when its revocation begins is decided expired without a
// call; one whose expiry passes while its hook is called is waited for to
// the deadline like any other (Pending): the expiry is its registrant's word.
// Resume starts again, after a restart, the revocations already begun and
// still undecided, never deciding one expired: each was live when its
// revocation began, and a declared expiry that passed while the control
// plane was down does not make the hook's silence an expiry. DispatchBegun
// (DispatchReadBegun) starts again a revocation whose start the caller
// stored (a termination's chunk run again after a restart before it
// committed): only what had expired when it began is decided expired.
//
// Nothing the workload registers can hold a termination hostage: a revoke
// webhook may only point at a destination the operator allowed
// (AllowHooks), a node holds at most MaxPerNode live privileges of each
// registrant's (and keeps as many expired ones listed), and the
// revocations run in parallel off the reconciler's path, each bounded by
// the termination's hook deadline, redirects never followed. The
// revocations in flight are bounded (Concurrency), and an operator's
// privileges are called before any agent registered: a rogue's hooks that
// never answer hold no slot an operator's privilege waits for.
//
// Callers' duties:
//   - Set AllowHooks from the operator's configuration (HookAllowFlag);
//     empty allows no webhook at all.
//   - Give Dispatch a context that lives as long as the reconciler: the
//     calls it starts outlive the call to Dispatch, and a restarted
//     reconciler calls Resume for what is undecided.
//   - Make in-process revokers idempotent: a privilege may be revoked
//     again after a restart.
package privilege
