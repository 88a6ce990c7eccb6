// Package agentsdk is how agent frameworks and tool servers plug into
// Tether. It speaks only the public API (Connect over HTTP/2), so everything
// here can be rebuilt in any language from proto/tether/v1.
//
// A Conn gives every unary call whose context has no deadline one of
// DefaultTimeout (WithTimeout changes it), as the TypeScript and Python
// SDKs do: a control plane that never answers holds no Join, Spawn or
// ConfirmExit for longer. Streams carry none.
//
// A unary call the control plane refused resource_exhausted with a retry
// hint (a rate limit's: Retry-After, RetryInfo) is sent again after the
// hint, up to DefaultRetry's attempts, within the call's deadline
// (WithRetry; RetryPolicy), as the TypeScript and Python SDKs do.
//
// ListSubtree (TypeScript listSubtree, Python list_subtree) lists a
// subtree a page at a time (ListNodes subtree_pages) and follows the pages
// to its end: ListNodes of a subtree without subtree_pages answers it in
// one message, which a rogue in the subtree makes larger than a Conn reads
// (MaxMessageBytes) by spawning children that carry every label allowed.
//
// For agent frameworks:
//
//   - Agent registers (or joins with a credential its parent obtained by
//     Spawn), keeps its session open, refreshes its credential, spawns and
//     delegates to its children, and exposes drain and abort as context
//     cancellation plus callbacks. An agent never holds its own kill switch:
//     it can only propose its own stop.
//   - LeaseWorker works under a fenced job lease (see leaseworker.go).
//   - Launcher runs an agent process and, when the control plane drains
//     it (a rollout), starts the target version as a new node and confirms
//     the old process's exit from outside (see launcher.go).
//
// For tool servers:
//
//   - ToolGate wraps a tool handler (a Go function or net/http middleware):
//     it has the control plane verify the caller's capability token and
//     record the call, cancels the handler's context when a cancel order
//     arrives, and acknowledges the cancel only after the handler returned,
//     and only if the cancel stopped it (it returned the context's error);
//     a handler that returned nil or its own error after the order is
//     recorded completed or failed. A handler stopped by its caller's own
//     cancellation is acknowledged if the control plane has ordered the
//     call's cancel, and recorded failed otherwise (the TypeScript and
//     Python gates follow the same rule).
//     It authenticates with a tool-server token (tether token create
//     --tool-server NAME), never with an agent's credential: what a call's
//     end or cancel acknowledgement says must not come from the agent.
//   - Verifier checks capability tokens offline against JWKS and the
//     revocation feed, and fails closed when the feed goes stale. On an
//     agent's credential it follows that agent's tree only, and refuses
//     another tree's token (ErrTreeNotFollowed).
//   - Fence rejects side effects from an older lease generation and, with
//     IssuedGenerations, from a generation without authority now. Behind
//     a ToolGate on the same tool-server credential, IssuedGenerations
//     names the gate's call (GateCallID), so the control plane keeps a side
//     effect under an exited holder's generation on the holder only when
//     the call is the holder's own, and refuses a call that is neither the
//     holder's nor one of its descendants' (no authority under another
//     agent's lease).
//
// # Job leases
//
// LeaseWorker.Accept ACKs an offered lease and renews it until the
// coordinator's answer says the generation lost authority (expired,
// superseded, terminal). Expiry is the coordinator's; the worker's clock
// schedules renewals and bounds only what the job can prove: once it
// passes the last accepted ACK's or renewal's send time plus the lease
// duration (a partition, answers that never come), the job ends with
// ErrLeaseUnconfirmed — at or before the coordinator's expiry, never
// after, and never extending it. A job resumed by a repeated ACK renews
// at once to prove its window.
// A cancel request seen in an answer cancels the job's context (cause
// ErrLeaseCancelled), runs JobOptions.OnCancel, then acknowledges it.
// Progress and results that cannot be delivered are appended, fsynced, to a
// spool in LeaseWorkerConfig.SpoolDir and replayed in order — with their
// original sequences and sent_at, also by a later process on the same
// directory — before anything newer is sent; the coordinator judges each
// on its own, so a result from a generation that expired meanwhile is
// recorded, never accepted. Job.Header sets the job id and generation that
// a tool server's Fence checks before any side effect.
//
// A Conn, a Child, a Grant and a CapabilityToken print (fmt, slog) without
// the bearer token, credential or capability token they hold; encoding/json
// still carries a Child's credential and a Grant's token.
//
// Caller duties: close what you open (ToolGate.Close, LeaseWorker.Close,
// which ends the jobs it runs); treat a drain signal as "finish what you
// are doing, start nothing new, then exit", and abort as "stop now"
// (OnDrain and OnAbort callbacks run on goroutines of their own, so one
// may wait for the work in flight, or call Exit, while the session still
// hears the abort that escalates a drain; Agent.DrainDeadline says, on the
// control plane's clock, until when the stop waits before it acts on its
// own); claim your exit (Agent.Exit) as
// the very last thing, or let your launcher confirm it from outside the process. An
// agent's own word is a claim: the record counts it only if the control
// plane saw the session end and nothing from the agent afterwards, and
// anything the agent sends after it is refused and recorded against it.
package agentsdk
