import { Code, ConnectError } from "@connectrpc/connect";

/**
 * The reason of an agent's {@link Agent.signal} when the control plane
 * aborts it (and of its {@link Agent.drainSignal} when it drains).
 */
export class StopSignalled extends Error {
  override readonly name = "StopSignalled";
  constructor(
    readonly abort: boolean,
    readonly terminationId: string,
    readonly reason: string,
  ) {
    super(`tether: ${abort ? "aborted" : "draining"} by the control plane${terminationId ? ` (termination ${terminationId})` : ""}${reason ? `: ${reason}` : ""}`);
  }
}

/**
 * Thrown by a gated call (and the reason of the tool function's
 * AbortSignal) when the control plane cancelled it.
 */
export class ToolCallCancelled extends Error {
  override readonly name = "ToolCallCancelled";
  constructor(readonly callId: string) {
    super(`tether: tool call ${callId} cancelled by the control plane`);
  }
}

/** Reports whether err is the control plane refusing a call because the caller's node is draining or aborting. */
export function isRefusedStopping(err: unknown): boolean {
  return err instanceof ConnectError && err.code === Code.FailedPrecondition;
}

/** Reports whether err is the control plane refusing a capability token (bad, revoked, or lacking the scope). */
export function isRefusedToken(err: unknown): boolean {
  return err instanceof ConnectError && (err.code === Code.PermissionDenied || err.code === Code.Unauthenticated);
}
