import { AsyncLocalStorage } from "node:async_hooks";

import { Code, ConnectError } from "@connectrpc/connect";

import { Conn } from "./conn.js";
import { ToolCallCancelled } from "./errors.js";
import type { ToolCall } from "./gen/tether/v1/tool_pb.js";
import { anySignal, sleep, textOf, withoutSecret } from "./internal.js";

/** Where a tool server's caller puts its capability token (Authorization stays free for the tool's own auth). */
export const CapabilityHeader = "X-Tether-Capability";

/**
 * The most cancel orders a gate holds for calls it has not registered,
 * however many begins are under way (the Go gate's MaxEarlyOrders): an
 * order is early by a round trip at most, and each begin settled walks the
 * orders held.
 */
export const MaxEarlyOrders = 1024;

/**
 * The longest call id of an order a gate holds, in UTF-8 bytes (the Go and
 * Python gates' bound): the control plane's call ids are some thirty bytes,
 * and an order for a longer one (a hostile peer's, up to a message's 16 MiB
 * each) is for no call this gate could begin.
 */
const maxCallIdBytes = 256;

/**
 * How long a gate with calls in flight (or begins under way) keeps one
 * WatchCancels stream before it opens another, in ms (the Go gate's
 * CancelWatchRefresh, the Python gate's CANCEL_WATCH_REFRESH). The stream
 * carries cancel orders only, so a silent one is what an honest control
 * plane with nothing to cancel sends too: a hostile element on the gate's
 * path (a proxy that stalls the stream, a peer) that relayed its opening
 * and then nothing had the gate deaf to every cancel order for good, its
 * tools running on past their cancel and the agent's abort recording them
 * unacknowledged, even once the path was honest again (rogue44B test). The
 * control plane sends every pending order again on a new stream, so a
 * stalled stream costs a gate at most this long; a gate with nothing in
 * flight keeps its stream (an order is only ever for a call it began, and
 * a begin makes it busy). A gate's {@link ToolGateOptions.cancelWatchRefreshMs}
 * is what it uses.
 */
export const CancelWatchRefreshMs = 15_000;

const gateCall = new AsyncLocalStorage<{ callId: string; nodeId: string }>();

/**
 * The id of the {@link ToolGate} call whose function runs now (the control
 * plane's call id, as BeginCall answered it), or "" outside a gate's
 * function. A {@link Fence} whose check is issuedGenerations names it in
 * its question, so the control plane knows whose side effect it is asked
 * about (the call's node, from its own ledger) and keeps it on the lease's
 * holder only when the call is the holder's (the Go SDK's GateCallID).
 */
export function gateCallId(): string {
  return gateCall.getStore()?.callId ?? "";
}

/** The node whose {@link ToolGate} call's function runs now, or "" (a fence's MaxStale answers are kept per caller). */
export function gateCallNode(): string {
  return gateCall.getStore()?.nodeId ?? "";
}

/** A capability token, or something that yields a fresh one (e.g. a {@link CapabilityToken}). */
export type TokenSource = string | { get(): Promise<string> } | (() => string | Promise<string>);

/** Resolves a {@link TokenSource} to the token to present now. */
export async function tokenOf(source: TokenSource): Promise<string> {
  if (typeof source === "string") return source;
  if (typeof source === "function") return source();
  return source.get();
}

/** Options for one gated call. */
export interface CallOptions {
  /** The scope the call needs, e.g. "tool:shell"; default "tool:<tool>". */
  requiredScope?: string;
  /**
   * The caller's own signal: the tool function's signal aborts when it does,
   * too. A call it aborts while the control plane begins it is ended
   * without running the tool. A call it stops is acknowledged if the control
   * plane has ordered the call's cancel, and recorded failed otherwise.
   */
  signal?: AbortSignal;
}

/** Options for a {@link ToolGate}. */
export interface ToolGateOptions {
  /**
   * Ignore cancel orders and acknowledge no call, not even one the
   * caller's signal stopped (fault injection for tests and demos: a gate
   * that never acknowledges).
   */
  neverAck?: boolean;
  /**
   * Called with the ledger's entry each time the control plane has recorded
   * a call's end (EndCall or CancelAck answered): the record as stored, for
   * logs and tests.
   */
  onRecorded?: (call: ToolCall) => void;
  /**
   * How long a busy gate keeps one WatchCancels stream, in ms; default
   * {@link CancelWatchRefreshMs} (a test sets it shorter; one that is not a
   * positive number is the default).
   */
  cancelWatchRefreshMs?: number;
}

/**
 * ToolGate stands in front of tools. For each call it has the control plane
 * verify the capability token and the caller's node state and record the
 * call (ToolService.BeginCall); it runs the tool function with an
 * AbortSignal that a cancel order from the control plane aborts; and once
 * the function has settled it reports what the function did: the cancel
 * acknowledgement (CancelAck) only when it stopped because of the cancel
 * (rejected with the signal's reason or an AbortError), otherwise the end
 * (EndCall): completed when it returned a result, even after the order,
 * failed when it threw its own error. A function stopped by the caller's
 * own signal (it rejected with the signal's reason or an AbortError) is
 * acknowledged if the control plane has ordered its cancel by the time the
 * gate reports, and failed otherwise.
 *
 * The gate authenticates as the tool server (its own token, never an
 * agent's credential): the ledger's evidence of a call comes from the tool
 * layer, not from the agent being stopped.
 */
export class ToolGate {
  /** Names the gate in the ledger (provenance of every entry). */
  readonly id: string;
  readonly conn: Conn;
  readonly #neverAck: boolean;
  readonly #onRecorded?: (call: ToolCall) => void;
  readonly #refreshMs: number;
  #inflight = new Map<string, AbortController>();
  // Cancel orders that arrived before their call was registered here, each
  // with how many begins had started by then: an order can only be for a
  // call whose begin had started (the control plane orders the cancel of a
  // call it recorded), so it is dropped once those begins have all
  // settled. Orders for calls this gate never began (a previous process's,
  // or a hostile peer's made-up ids) are not kept, and at most
  // MaxEarlyOrders are held while begins are always under way.
  #early = new Map<string, number>();
  #begins = 0;
  #beginning = new Set<number>();
  #calls = new Set<Promise<unknown>>();
  #closed = new AbortController();
  #ready: Promise<void>;
  #markReady!: () => void;
  #watching: Promise<void>;

  /**
   * Returns a gate reporting as id over conn (the tool server's token) and
   * starts following its cancel orders.
   */
  constructor(conn: Conn, id: string, options: ToolGateOptions = {}) {
    this.conn = conn;
    this.id = id;
    this.#neverAck = options.neverAck ?? false;
    this.#onRecorded = options.onRecorded;
    // A timer waits 2^31 - 1 ms at most (one asked for longer fires after
    // 1 ms, the stream reopened in a loop); one not a positive count is
    // the default.
    const refresh = options.cancelWatchRefreshMs ?? CancelWatchRefreshMs;
    this.#refreshMs = Number.isFinite(refresh) && refresh > 0 ? Math.min(refresh, 2 ** 31 - 1) : CancelWatchRefreshMs;
    this.#ready = new Promise((resolve) => (this.#markReady = resolve));
    this.#watching = this.#watch();
  }

  /**
   * Resolves once the gate follows its cancel orders: its first
   * WatchCancels stream is asked for (the control plane sends every
   * pending order on a stream as it opens).
   */
  get ready(): Promise<void> {
    return this.#ready;
  }

  /**
   * Waits for the calls in flight to end and be reported (so a process
   * that exits after close() leaves no call unreported), then stops
   * following cancel orders.
   */
  async close(): Promise<void> {
    await Promise.allSettled(this.#calls);
    this.#closed.abort();
    await this.#watching;
  }

  async #watch(): Promise<void> {
    const signal = this.#closed.signal;
    while (!signal.aborted) {
      // The stream is given up (and another opened at once) once it has
      // lasted a refresh interval at a moment the gate is busy: a path
      // that holds it silent deafens the gate that long at most.
      const stream = new AbortController();
      let refreshed = false;
      const ticker = setInterval(() => {
        if (this.#inflight.size === 0 && this.#beginning.size === 0) return;
        refreshed = true;
        clearInterval(ticker);
        stream.abort();
      }, this.#refreshMs);
      ticker.unref?.();
      try {
        const orders = this.conn.tool.watchCancels({ gateId: this.id }, { signal: AbortSignal.any([signal, stream.signal]) });
        // Ready once the stream is asked for, as the Go gate's Ready: it
        // resolved once the stream's headers arrived, and a path that
        // withheld them held a tool server awaiting `ready` for good (an
        // idle gate keeps its stream). A call begun makes the gate busy,
        // and a busy gate gives up a stream that carries nothing at the
        // refresh interval (rogue44J test).
        this.#markReady();
        for await (const order of orders) this.#cancel(order.callId);
      } catch {
        // reconnect below; a closed gate leaves the loop
      } finally {
        clearInterval(ticker);
      }
      if (refreshed && !signal.aborted) continue; // opened anew at once: the control plane sends every pending order again
      await sleep(200, signal);
    }
    this.#markReady();
  }

  /** How many cancel orders the gate holds for calls it has not registered (yet). */
  get heldOrders(): number {
    return this.#early.size;
  }

  #cancel(callId: string): void {
    if (this.#neverAck) return;
    const c = this.#inflight.get(callId);
    if (c) c.abort(new ToolCallCancelled(callId));
    else if (this.#beginning.size > 0 && this.#early.size < MaxEarlyOrders && Buffer.byteLength(callId, "utf8") <= maxCallIdBytes) {
      this.#early.set(callId, this.#begins);
    }
  }

  /** Settles the begin numbered n: drops the orders no begin still under way can be for. */
  #settled(n: number): void {
    this.#beginning.delete(n);
    let oldest = Infinity;
    for (const b of this.#beginning) oldest = Math.min(oldest, b);
    for (const [callId, begun] of this.#early) if (begun < oldest) this.#early.delete(callId);
  }

  /**
   * Runs fn as one recorded tool call. It rejects with the control plane's
   * refusal (a ConnectError: permission_denied for a bad or revoked token,
   * failed_precondition while the node drains) without running fn. When
   * the control plane cancels the call, fn's signal aborts with a
   * {@link ToolCallCancelled}: fn stops by rejecting with it (or an
   * AbortError), and the gate acknowledges the cancel and rejects with it.
   * A call whose cancel was ordered before fn ran (the order came before
   * BeginCall's answer) does not run fn at all: the gate acknowledges the
   * cancel and rejects with the ToolCallCancelled.
   * An fn that returns a result or throws its own error after the order is
   * recorded completed or failed, and the call resolves or rejects as fn did.
   */
  call<T>(token: TokenSource, tool: string, fn: (signal: AbortSignal) => Promise<T> | T, options: CallOptions = {}): Promise<T> {
    const call = this.#call(token, tool, fn, options);
    this.#calls.add(call);
    const forget = () => this.#calls.delete(call);
    call.then(forget, forget);
    return call;
  }

  async #call<T>(token: TokenSource, tool: string, fn: (signal: AbortSignal) => Promise<T> | T, options: CallOptions): Promise<T> {
    // BeginCall does not follow the caller's signal: a caller that gives up
    // once the control plane has recorded the begin, but before the answer
    // arrives, would leave a call in flight in the ledger that nobody ends
    // (the gate never learns its id). The gate waits for the answer and
    // ends a call whose caller is gone without running it.
    const presented = await tokenOf(token);
    const n = ++this.#begins;
    this.#beginning.add(n);
    const cancel = new AbortController();
    let callId: string;
    let nodeId = "";
    try {
      const begin = await this.conn.tool.beginCall(
        { token: presented, tool, gateId: this.id, requiredScope: options.requiredScope ?? "" },
        { signal: AbortSignal.timeout(10_000) },
      );
      callId = begin.call?.callId ?? "";
      nodeId = begin.call?.nodeId ?? "";
      if (callId === "") {
        // A proxy's, or a hostile peer's answer: no call to run or report.
        throw new ConnectError("the control plane answered BeginCall without a call", Code.Internal);
      }
      if (begin.call?.tool !== tool) {
        // Another call's answer (the control plane records the tool it is
        // asked for): run under it, the function was recorded as that
        // call, whose end was already reported or is another gate's
        // (rogue45F test).
        throw new ConnectError(`the control plane answered BeginCall of ${JSON.stringify(tool.slice(0, 128))} with a call of another tool`, Code.Internal);
      }
      if (this.#inflight.has(callId)) {
        // An answer naming a call this gate has in flight: the control
        // plane begins each call under an id of its own, so it is another
        // call's answer (a path that replays or crosses answers). Run under
        // it, the function's registration replaced the other call's abort
        // and its end removed it, and its EndCall recorded the other call
        // ended while that call's tool ran on, deaf to its cancel (rogue45F
        // test). The function is not run and nothing is reported: the call
        // this answer should have named is unknown to the gate and stays in
        // flight in the ledger, as a call whose answer a path withholds.
        throw new ConnectError(`the control plane answered BeginCall with call ${Buffer.byteLength(callId, "utf8") <= maxCallIdBytes ? JSON.stringify(callId) : "(an id past 256 bytes)"}, which this gate has in flight`, Code.Internal);
      }
      this.#inflight.set(callId, cancel);
      if (this.#early.delete(callId)) cancel.abort(new ToolCallCancelled(callId));
    } finally {
      this.#settled(n);
    }
    let result: T | undefined;
    let failure: unknown;
    let failed = false;
    try {
      // The control plane ordered the call's cancel before the tool ran (an
      // early order: it came before BeginCall's answer). The function is
      // not called: run with an aborted signal, a tool that does its side
      // effect before it looks at its signal (most never look) did it
      // after its stop, and the ledger read the call completed (rogue43G
      // test). The cancel is acknowledged below: the call stopped on it.
      if (cancel.signal.aborted) throw cancel.signal.reason;
      if (options.signal?.aborted) throw options.signal.reason; // the caller left before the tool ran
      const signal = anySignal([cancel.signal, options.signal]);
      result = await gateCall.run({ callId, nodeId }, () => fn(signal));
    } catch (err) {
      failure = err;
      failed = true;
    } finally {
      this.#inflight.delete(callId);
    }
    // Report without the caller's signal: the ledger must hear how the call
    // ended even when the caller gave up.
    const report = { signal: AbortSignal.timeout(10_000) };
    // Only a function the cancel order stopped acknowledges it: one that
    // returned a result after the order ran to its end (its side effect
    // happened), and one that failed on its own account failed. The ledger
    // records them as such, never as cancelled.
    if (cancel.signal.aborted && failed && stoppedBy(failure, cancel.signal.reason)) {
      const acked = await this.conn.tool.cancelAck({ callId, gateId: this.id }, report);
      if (acked.call) this.#onRecorded?.(acked.call);
      throw failure;
    }
    // A function stopped by the caller's own signal, before the gate heard
    // an order (an agent's run is aborted on its abort signal, which can
    // arrive first; the control plane writes an aborting node's cancel
    // orders before it tells the agent): if the control plane has ordered
    // the cancel, the abort waits for this call's acknowledgement, and the
    // call did stop after the order existed, so the gate acknowledges it.
    // The control plane refuses the acknowledgement of a call with no
    // order (failed_precondition): the call then failed, with the caller's
    // reason as its error.
    const caller = options.signal;
    if (!this.#neverAck && failed && caller?.aborted && stoppedBy(failure, caller.reason)) {
      const acked = await this.conn.tool.cancelAck({ callId, gateId: this.id }, report).catch((err: unknown) => {
        if (ConnectError.from(err).code === Code.FailedPrecondition) return undefined;
        throw err;
      });
      if (acked) {
        if (acked.call) this.#onRecorded?.(acked.call);
        throw failure;
      }
    }
    const ended = await this.conn.tool.endCall(
      { callId, gateId: this.id, failed, error: failed ? describe(failure, presented) : "" },
      report,
    );
    if (ended.call) this.#onRecorded?.(ended.call);
    if (failed) throw failure;
    return result as T;
  }

  /**
   * Wraps a tool function so that every call goes through the gate with the
   * token the source yields at call time.
   */
  wrap<A extends unknown[], T>(
    tool: string,
    token: TokenSource,
    fn: (signal: AbortSignal, ...args: A) => Promise<T> | T,
    options: Omit<CallOptions, "signal"> = {},
  ): (...args: A) => Promise<T> {
    return (...args: A) => this.call(token, tool, (signal) => fn(signal, ...args), options);
  }
}

/**
 * Reports whether a tool function's rejection is the cancellation itself:
 * the signal's reason (a {@link ToolCallCancelled}), or an AbortError (what
 * fetch and other signal-aware APIs reject with).
 */
function stoppedBy(failure: unknown, reason: unknown): boolean {
  return failure === reason || failure instanceof ToolCallCancelled || (failure instanceof Error && failure.name === "AbortError");
}

/**
 * The error a failed call reports to the ledger: the tool's message without
 * the caller's capability token, nor its signature (what makes a copy
 * usable). A tool's error may echo its input, the ledger is read by every
 * viewer, and the token is a bearer credential for tools. It is cut out
 * before the clip, which could leave a usable piece.
 */
function describe(err: unknown, token: string): string {
  const text = withoutSecret(textOf(err, "the tool failed with a value that has no text"), token, "capability token");
  return text.length > 512 ? `${text.slice(0, 509)}...` : text;
}
