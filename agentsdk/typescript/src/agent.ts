import { Code, ConnectError } from "@connectrpc/connect";

import { Conn, MaxReconnectHintMs, retryHintMs, stretched, waitBy, type DialOptions } from "./conn.js";
import { StopSignalled } from "./errors.js";
import { compactJWS, MaxTokenBytes } from "./capability.js";
import type { Node, SessionCredential, SessionRequest, SessionResponse, SessionSignal } from "./gen/tether/v1/agent_pb.js";
import { SignalKind } from "./gen/tether/v1/agent_pb.js";
import type { Grant as GrantMessage } from "./gen/tether/v1/capability_pb.js";
import type { StopProposal } from "./gen/tether/v1/proposal_pb.js";
import { abortWaitHooks, AsyncQueue, dateOf, durationFromMs, endsRun, printedWithout, textOf } from "./internal.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { SessionRequestSchema } from "./gen/tether/v1/agent_pb.js";

/** A drain or abort order from the control plane. */
export interface Signal {
  abort: boolean;
  terminationId: string;
  reason: string;
  /**
   * On a drain, when the stop next acts on its own, on the control plane's
   * clock (undefined: the signal carried none): while it drains, the end of
   * its drain window (the calls still in flight are then cancelled, the
   * agent aborted); once the drain ended (every call ended, at once for an
   * agent with none) and its grants were revoked, the end of its wait for
   * the exit (the record is then written and the credential refused). The
   * control plane's, read from the stop it holds: the agent stretches
   * nothing by it. A stop's first drain signal may come before it set one
   * (a later one carries it), and a stop that takes the node over sends its
   * own ({@link Agent.drainDeadline} follows them). The abort may come sooner.
   */
  deadline?: Date;
}

/**
 * How many of a session's heartbeats in a row may go unanswered before the
 * agent takes the session for dead, ends it (Code.Unavailable) and opens
 * another on run's usual backoff. The control plane answers each heartbeat
 * (its acknowledgement), so a session that carries none back for that many
 * intervals is stalled on the way (a proxy's, a hostile peer's): the agent
 * waited on such a stream for good, deaf to its node's stop once the path
 * was honest again (rogue42O test; the Go SDK's MaxUnansweredHeartbeats,
 * rogue42j).
 */
export const MaxUnansweredHeartbeats = 3;

/** The error that ends a session whose heartbeats went unanswered. */
function sessionSilent(): ConnectError {
  return new ConnectError(`tether: the session carried nothing back for ${MaxUnansweredHeartbeats} heartbeats; opening another`, Code.Unavailable);
}

/** A spawned child: its node and the credential to hand to the child's process (which calls {@link Agent.join}). */
export interface Child {
  node: Node;
  credential: string;
}

/** A capability grant with its current token. */
export interface Grant {
  grant: GrantMessage;
  token: string;
  expiresAt: Date;
}

/** Options for {@link Agent.run}. */
export interface RunOptions {
  /** Ends the session loop (the node keeps running; the agent just stops listening). */
  signal?: AbortSignal;
  /** Session heartbeat interval in ms (default 5000). Heartbeats also bring refreshed credentials. */
  heartbeatMs?: number;
  /**
   * Told each time the session broke and when it reconnects, and of a
   * signal callback that threw or whose promise rejected (the other
   * callbacks run all the same); default silent.
   */
  warn?: (message: string) => void;
}

/**
 * One agent node: its credential, its session with the control plane, and
 * the signals that fire when the control plane says so.
 *
 * - {@link Agent.drainSignal} aborts when a drain (or abort) arrives: finish
 *   what is in flight, start nothing new, then {@link Agent.confirmExit}.
 * - {@link Agent.signal} aborts when an abort arrives (reason: a
 *   {@link StopSignalled}): pass it to every piece of work that must stop.
 *
 * An agent never holds its own kill switch: it can only propose its own stop.
 */
export class Agent {
  readonly conn: Conn;
  // Its identity, for good (the Go SDK's Agent.id): every call names it,
  // and a session's opened message refreshes #node only when it names it.
  readonly #id: string;
  #node: Node;
  #drain = new AbortController();
  #abort = new AbortController();
  #onDrain: ((s: Signal) => void)[] = [];
  #onAbort: ((s: Signal) => void)[] = [];
  // The signals as they arrived: a callback registered after its signal
  // runs at once.
  #drained?: Signal;
  #aborted?: Signal;
  // The latest drain signal's deadline.
  #drainDeadline?: Date;
  #opened: Promise<void>;
  #markOpened!: () => void;
  #credentialExpiresAt?: Date;
  // The open session, while there is one: confirmExit sends the claim over
  // it. exited: the claim was made; run opens no session after it.
  #live?: { claim: (reason: string) => void; ended: Promise<void>; claimed: boolean };
  #exited = false;
  // Settles when the heartbeat run sends in place of a refused session has
  // been answered (undefined: none under way); confirmExit claims after it.
  #beating?: Promise<void>;
  // The latest run's warn: where a failed signal callback is reported.
  #warn?: (message: string) => void;
  // The onAbort callbacks' promises not yet settled (each already
  // guarded): run waits for them before it ends on a dead credential.
  #abortRunning = new Set<Promise<void>>();

  private constructor(conn: Conn, node: Node, credentialExpiresAt?: Date) {
    this.conn = conn;
    this.#id = node.nodeId;
    this.#node = node;
    this.#credentialExpiresAt = credentialExpiresAt;
    this.#opened = new Promise((resolve) => (this.#markOpened = resolve));
  }

  /** Registers a root agent with an operator connection and returns it, connected with its own credential. */
  static async registerRoot(operator: Conn, name: string, labels: Record<string, string> = {}, options?: DialOptions): Promise<Agent> {
    const resp = await operator.agent.registerRoot({ name, labels });
    if (!resp.node) throw new Error("tether: RegisterRoot answered without a node");
    return new Agent(Conn.dial(operator.baseUrl, resp.credential, options), resp.node, dateOf(resp.credentialExpiresAt));
  }

  /** Connects a spawned child's process with the credential its parent handed over. */
  static async join(baseUrl: string, credential: string, options?: DialOptions): Promise<Agent> {
    const conn = Conn.dial(baseUrl, credential, options);
    try {
      const who = await conn.auth.whoAmI({});
      if (!who.nodeId) throw new Error("tether: Agent.join needs an agent credential, not an operator token");
      const got = await conn.agent.getNode({ nodeId: who.nodeId });
      if (!got.node) throw new Error("tether: GetNode answered without a node");
      return new Agent(conn, got.node, who.expiresAt ? dateOf(who.expiresAt) : undefined);
    } catch (err) {
      conn.close();
      throw err;
    }
  }

  /** The agent's node as last seen. */
  get node(): Node {
    return this.#node;
  }

  get nodeId(): string {
    return this.#id;
  }

  /** The agent's current credential (refreshed by the session). Never log it. */
  get credential(): string {
    return this.conn.token;
  }

  /** When the current credential expires, if known. */
  get credentialExpiresAt(): Date | undefined {
    return this.#credentialExpiresAt;
  }

  /** Aborts when the control plane aborts the agent; its reason is a {@link StopSignalled}. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** Aborts when the agent is told to drain or abort: finish what is in flight, start nothing new. */
  get drainSignal(): AbortSignal {
    return this.#drain.signal;
  }

  get draining(): boolean {
    return this.#drain.signal.aborted;
  }

  /**
   * Resolves true once the agent is told to drain or abort, or false after
   * timeoutMs without it. For the moment after a refused call: a stop's
   * revocation of the agent's grants can reach the control plane's gate
   * before its signal reaches the agent, so a refused token may be the stop
   * whose signal is on its way; false says the refusal was not a stop.
   */
  waitForStop(timeoutMs: number): Promise<boolean> {
    const signal = this.#drain.signal;
    if (signal.aborted) return Promise.resolve(true);
    return new Promise((resolve) => {
      const onStop = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        signal.removeEventListener("abort", onStop);
        resolve(false);
      }, timeoutMs);
      signal.addEventListener("abort", onStop, { once: true });
    });
  }

  /** Resolves once the first session is open (the agent is then reachable by signals). */
  get opened(): Promise<void> {
    return this.#opened;
  }

  /**
   * Registers a callback run once when a drain (or abort) arrives, at once
   * if it already has (a child that joins into its parent's stop hears it
   * first thing, maybe before it registers). An async callback is not
   * awaited: it may wait for the work in flight, or for confirmExit. The
   * signals abort before any callback runs; a callback that throws, or
   * whose promise rejects, is reported to {@link RunOptions.warn} and the
   * next one runs; so is one registered after its signal, run at once.
   */
  onDrain(f: (s: Signal) => void): void {
    if (this.#drained) this.#callback("onDrain", f, this.#drained);
    else this.#onDrain.push(f);
  }

  /**
   * Registers a callback run once when an abort arrives, at once if it
   * already has, guarded as {@link Agent.onDrain}'s. An async callback's
   * promise is not awaited by the signal, but {@link Agent.run}, ending on
   * a dead credential, settles only once every onAbort callback's promise
   * has (those the abort signal started and those registered after it), so
   * that an agent whose process ends with run has done its cleanup: it
   * must not wait for run itself (unless it aborts run's signal first).
   */
  onAbort(f: (s: Signal) => void): void {
    if (this.#aborted) this.#callback("onAbort", f, this.#aborted);
    else this.#onAbort.push(f);
  }

  /**
   * The deadline of the drain the agent is under, as its latest drain signal
   * gave it ({@link Signal.deadline}; undefined: none yet, or that signal
   * carried none), on the control plane's clock: a stop that takes the node
   * over (an operator's drain over its parent's) sends its own.
   */
  get drainDeadline(): Date | undefined {
    return this.#drainDeadline;
  }

  #handle(sig: Pick<SessionSignal, "kind" | "terminationId" | "reason" | "deadline">): void {
    const s: Signal = { abort: sig.kind === SignalKind.ABORT, terminationId: sig.terminationId, reason: sig.reason };
    if (!s.abort) {
      // Every drain signal, not only the first: a stop that takes the node
      // over drains it on its own deadline, earlier or later (rogue37a test).
      if (sig.deadline) s.deadline = timestampDate(sig.deadline);
      this.#drainDeadline = s.deadline;
    }
    // Both signals are noted (and abort) before any callback runs, and
    // each callback runs guarded: one that threw skipped every callback
    // after it for good, and on an abort that came first left agent.signal
    // unaborted until the session, broken by the throw, reconnected; one
    // whose promise rejected was an unhandled rejection, which ends a Node
    // process (rogue38K tests). As the Go SDK, which ends Context before
    // its callbacks run, and the Python SDK, which logs a failed callback
    // and runs the next.
    let drainFs: ((s: Signal) => void)[] = [];
    let abortFs: ((s: Signal) => void)[] = [];
    if (!this.#drain.signal.aborted) {
      this.#drained = s;
      drainFs = this.#onDrain;
      this.#onDrain = [];
      this.#drain.abort(new StopSignalled(s.abort, s.terminationId, s.reason));
    }
    if (s.abort && !this.#abort.signal.aborted) {
      this.#aborted = s;
      abortFs = this.#onAbort;
      this.#onAbort = [];
      this.#abort.abort(new StopSignalled(true, s.terminationId, s.reason));
    }
    for (const f of drainFs) this.#callback("onDrain", f, s);
    for (const f of abortFs) this.#callback("onAbort", f, s);
  }

  /**
   * Runs a signal callback; its throw or its promise's rejection goes to
   * the run's warn. An onAbort callback's promise is noted as running
   * until it settles (run waits for it).
   */
  #callback(which: "onDrain" | "onAbort", f: (s: Signal) => void, s: Signal): void {
    const failed = (err: unknown) => this.#warn?.(`tether: an ${which} callback failed: ${textOf(err, "with a value that has no text")}`);
    try {
      const r: unknown = f(s);
      if (r !== null && typeof r === "object" && typeof (r as PromiseLike<unknown>).then === "function") {
        const settled = Promise.resolve(r as PromiseLike<unknown>).then(() => {}, failed);
        if (which === "onAbort") {
          this.#abortRunning.add(settled);
          void settled.then(() => this.#abortRunning.delete(settled));
        }
      }
    } catch (err) {
      failed(err);
    }
  }

  /**
   * Resolves once no onAbort callback's promise is pending (those started
   * while it waits included), or once signal aborts: Go's Run returns a
   * dead credential's refusal once no OnAbort callback runs. run returned
   * at once, the callbacks the session's abort signal had started still
   * running, and an agent whose process ends with run (`await
   * agent.run(); process.exit()`) was cut off in the middle of its
   * cleanup (rogue40G test).
   */
  async #abortCallbacksSettled(signal?: AbortSignal): Promise<void> {
    abortWaitHooks.get(this)?.();
    if (this.#abortRunning.size === 0 || signal?.aborted) return;
    let onStop: (() => void) | undefined;
    const stopped = new Promise<void>((resolve) => (onStop = resolve));
    signal?.addEventListener("abort", onStop!, { once: true });
    try {
      while (this.#abortRunning.size > 0 && !signal?.aborted) {
        await Promise.race([Promise.all(this.#abortRunning), stopped]);
      }
    } finally {
      signal?.removeEventListener("abort", onStop!);
    }
  }

  /**
   * Keeps the agent's session open until options.signal aborts, reconnecting
   * (with backoff) when the stream breaks, and applies the signals and
   * refreshed credentials it receives. It resolves when options.signal
   * aborts, or when the control plane ends the session because the node is
   * terminated after it was told so; it rejects when the credential is
   * refused without a signal first, or the control plane refuses the
   * session because the node's exit was confirmed (failed_precondition; a
   * launcher's attestation): the agent's work is aborted then too. Ending
   * so, on a dead credential, it settles once the onAbort callbacks'
   * promises have (those the abort signal started before included; see
   * {@link Agent.onAbort}), or options.signal aborts.
   * A session refused for a bound (resource_exhausted: the node's open
   * sessions, which whoever else holds its credential may hold, its signal
   * streams, its lineage's) is followed by a unary heartbeat, whose answer
   * carries the node's signal and a fresh credential as a session would;
   * its refusal of a dead credential or a confirmed exit ends run as the
   * session's would.
   * The wait before a reconnect doubles from 100 ms up to 5 s while
   * sessions fail to open, and starts again from 100 ms after one opened;
   * a refusal that gives a retry hint (resource_exhausted: the lineage's
   * rate limit) is not tried again before its hint, stretched as a unary
   * call's retry is, at most {@link MaxReconnectHintMs}, when that is
   * longer. The connection's {@link RetryOptions} wait and jitter wait.
   */
  async run(options: RunOptions = {}): Promise<void> {
    this.#warn = options.warn;
    let backoff = 100;
    for (;;) {
      // A signal that aborted during the wait (or before run) ends the
      // loop here: a session opened on it would never hear the abort. A
      // session after the exit claim would contradict it.
      if (options.signal?.aborted || this.#exited) return;
      let err: unknown;
      const session = { opened: false };
      try {
        await this.#session(options, session);
      } catch (e) {
        err = e;
      }
      if (options.signal?.aborted || this.#exited) return;
      if (err instanceof ConnectError && err.code === Code.ResourceExhausted) {
        // The session was refused for a bound: the node's open sessions
        // (held, maybe, by whoever else holds its credential: the parent
        // that spawned it keeps a copy), its signal streams, its
        // lineage's. Its signal still comes in a heartbeat's answer, and
        // so does a fresh credential: a rogue parent that held every
        // session its child may open had the child hear no stop of its
        // subtree, its work going on until its credential was refused at
        // the record (rogue40N test; the Go SDK's Run, rogue40a).
        const herr = await this.#heartbeat(options.signal);
        if (endsRun(herr)) err = herr;
        if (options.signal?.aborted || this.#exited) return;
      }
      const code = err instanceof ConnectError ? err.code : undefined;
      if (code === Code.Unauthenticated || code === Code.PermissionDenied) {
        // The credential is dead (the node was terminated): nothing to
        // reconnect to. Make sure work stops.
        const told = this.#drain.signal.aborted;
        this.#handle({ kind: SignalKind.ABORT, terminationId: "", reason: `credential rejected: ${Code[code]}` });
        await this.#abortCallbacksSettled(options.signal);
        if (told) return;
        throw err;
      }
      if (code === Code.FailedPrecondition) {
        // The node's exit was confirmed (a launcher's attestation while
        // the agent was cut off): the control plane refuses its every
        // session and heartbeat, before the "stop now" it signals such a
        // node, so the refusal is that signal. Reconnecting, the agent
        // had each refusal stored as evidence against its exit, and its
        // work was never told to stop.
        const told = this.#drain.signal.aborted;
        this.#handle({ kind: SignalKind.ABORT, terminationId: "", reason: "the node's exit was confirmed: stop now" });
        await this.#abortCallbacksSettled(options.signal);
        if (told) return;
        throw err;
      }
      // A session that opened was a success: the next break is a new
      // fault, not the next of a run of failures.
      if (session.opened) backoff = 100;
      // A refusal with a retry hint (the lineage's rate limit, spent) is
      // not tried again before the hint, stretched by up to half at
      // random as a unary call's retry is (the Go SDK's Run, rogue33b):
      // reconnecting on the backoff alone, an agent whose lineage's budget
      // a rogue of its lineage (its parent, holding its credential) keeps
      // spent came back after 100 ms, 200 ms, 400 ms..., each session and
      // the heartbeat in its place refused, until the budget refilled
      // (rogue41F test).
      let wait = backoff;
      const hint = retryHintMs(err);
      if (hint !== undefined) wait = Math.max(wait, Math.round(stretched(Math.min(hint, MaxReconnectHintMs), this.conn.retry.jitter)));
      options.warn?.(`tether: session with the control plane broke (${err === undefined ? "ended by the server" : (err as Error).message}); reconnecting in ${wait} ms`);
      // A wait that failed (options.signal aborted) ends run, as Go's Run.
      if (!(await waitBy(this.conn.retry, wait, options.signal))) return;
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  /**
   * Sends the unary heartbeat, in place of a session the control plane
   * refused, and applies its answer: the node's signal and a fresh
   * credential. It resolves with the heartbeat's error, if any. Not after
   * the exit claim (its activity would contradict it), and the claim
   * waits for it.
   */
  async #heartbeat(signal?: AbortSignal): Promise<unknown> {
    if (this.#exited) return undefined;
    let beaten!: () => void;
    const beating = new Promise<void>((resolve) => (beaten = resolve));
    this.#beating = beating;
    try {
      const resp = await this.conn.agent.heartbeat({ nodeId: this.#id }, { signal });
      if (resp.credential) this.#refreshed(resp.credential);
      if (resp.signal) this.#handle(resp.signal);
      return undefined;
    } catch (err) {
      return err;
    } finally {
      if (this.#beating === beating) this.#beating = undefined;
      beaten();
    }
  }

  /**
   * Takes the refreshed credential an answer carries (a session's message,
   * a heartbeat's answer) when it has a credential's shape, a compact JWS
   * within {@link MaxTokenBytes}, as the Go SDK's Agent does; the agent's
   * own is kept otherwise, and the run's warn told (the credential itself
   * not quoted). The connection took any text: an element on the path (a
   * proxy's, a hostile peer's) that handed the agent an empty credential,
   * or one with a space or a line break, had the SDK refuse its own next
   * session unauthenticated and abort the agent, a stop nobody ordered; one
   * past the control plane's bound (its parsers', or its 64 KiB of
   * headers) failed every later session, in the process or at the server,
   * or had the control plane refuse it, for good once the path was honest
   * again: the agent never heard its stop, or aborted itself (rogue42G
   * test).
   */
  #refreshed(c: SessionCredential): void {
    if (c.credential === "") return;
    if (!compactJWS(c.credential)) {
      this.#warn?.(
        `tether: an answer carried a refreshed credential that is not a compact JWS within ${MaxTokenBytes} bytes (${c.credential.length} characters); the agent keeps its own`,
      );
      return;
    }
    this.conn.setToken(c.credential);
    this.#credentialExpiresAt = dateOf(c.expiresAt);
  }

  async #session(options: RunOptions, session: { opened: boolean }): Promise<void> {
    const every = options.heartbeatMs && options.heartbeatMs > 0 ? options.heartbeatMs : 5000;
    const requests = new AsyncQueue<MessageInitShape<typeof SessionRequestSchema>>();
    const local = new AbortController();
    const stop = () => local.abort();
    options.signal?.addEventListener("abort", stop, { once: true });
    requests.push({ kind: { case: "hello", value: { nodeId: this.#id } } });
    // The heartbeats sent since the session last carried a message back;
    // past MaxUnansweredHeartbeats the session is taken for dead (silent:
    // set then) and ended, and run opens another.
    let unanswered = 0;
    let silent = false;
    const beat = setInterval(() => {
      if (++unanswered > MaxUnansweredHeartbeats) {
        silent = true;
        clearInterval(beat);
        local.abort();
        return;
      }
      requests.push({ kind: { case: "heartbeat", value: {} } });
    }, every);
    let ended!: () => void;
    let claimSent = false;
    const live = {
      // The claim travels behind every heartbeat already queued and is the
      // session's last word: the control plane ends the session after it.
      claim: (reason: string) => {
        clearInterval(beat);
        requests.push({ kind: { case: "exit", value: { reason } } });
        requests.end();
        claimSent = true;
      },
      ended: new Promise<void>((resolve) => (ended = resolve)),
      // Set once the session ended cleanly after the claim went out: the
      // control plane's answer to a claim it stored (one it could not
      // store ends the session with the error).
      claimed: false,
    };
    this.#live = live;
    try {
      for await (const msg of this.conn.agent.session(requests, { signal: local.signal }) as AsyncIterable<SessionResponse>) {
        unanswered = 0;
        switch (msg.kind.case) {
          case "opened":
            // The node as the control plane stored it, when it names this
            // node: taken whole, one naming another node (or none) had
            // the agent ask as that node from then on, its next session
            // refused permission_denied and the agent aborted on it, a
            // stop nobody ordered (rogue42G test; the Python SDK's,
            // rogue40H).
            if (msg.kind.value.node?.nodeId === this.#id) this.#node = msg.kind.value.node;
            session.opened = true;
            this.#markOpened();
            break;
          case "signal":
            this.#handle(msg.kind.value);
            break;
          case "credential":
            this.#refreshed(msg.kind.value);
            break;
        }
      }
      if (silent) throw sessionSilent();
      live.claimed = claimSent;
    } catch (err) {
      if (silent) throw sessionSilent();
      if (local.signal.aborted && err instanceof ConnectError && err.code === Code.Canceled) return;
      throw err;
    } finally {
      if (this.#live === live) this.#live = undefined;
      ended();
      clearInterval(beat);
      requests.end();
      options.signal?.removeEventListener("abort", stop);
      local.abort();
    }
  }

  /** Registers a child under this agent. Refused once the agent is draining or aborting. */
  async spawn(name: string, labels: Record<string, string> = {}): Promise<Child> {
    const resp = await this.conn.agent.spawn({ parentNodeId: this.#id, name, labels });
    if (!resp.node) throw new Error("tether: Spawn answered without a node");
    return printedWithout({ node: resp.node, credential: resp.credential }, "credential");
  }

  /**
   * Claims the agent's own exit and ends its session; call it last: from
   * then on the control plane refuses the agent's credential, and anything
   * the agent still sends is recorded as contradicting its claim (the
   * termination record then says the node is unaccounted). The claim goes
   * over the open session when there is one, behind its heartbeats, so
   * that it is the session's last word, and resolves once the control
   * plane ended the session (within the connection's timeoutMs, else it
   * rejects with deadline_exceeded); otherwise by ConfirmExit, and by
   * ConfirmExit as well when that session ends with an error rather than
   * the control plane's clean end after a claim it stored. A claim
   * counts in the record only when the control plane's own evidence
   * agrees; a launcher's confirmation (ConfirmExit with an operator token,
   * after the process ended) is an attestation.
   */
  async confirmExit(reason = ""): Promise<void> {
    this.#exited = true;
    // A heartbeat in place of a refused session: the claim goes after it.
    if (this.#beating !== undefined) await this.#beating;
    const live = this.#live;
    if (live === undefined) {
      await this.conn.agent.confirmExit({ nodeId: this.#id, reason });
      return;
    }
    live.claim(reason);
    const timeoutMs = this.conn.timeoutMs;
    if (!(timeoutMs > 0)) {
      await live.ended;
      await this.#claimAgainUnlessStored(live, reason);
      return;
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectError(`the control plane did not end the session within ${timeoutMs} ms of the exit claim`, Code.DeadlineExceeded)),
        timeoutMs,
      );
    });
    try {
      await Promise.race([live.ended, late]);
    } finally {
      clearTimeout(timer);
    }
    await this.#claimAgainUnlessStored(live, reason);
  }

  /**
   * A session that ended with an error after the claim (its replica went
   * away, or the control plane could not store the claim and said so) may
   * not have stored it: the claim is made by ConfirmExit then (a claim
   * already stored is not changed by another). Only a clean end after the
   * claim is the control plane's word that it stored it.
   */
  async #claimAgainUnlessStored(live: { claimed: boolean }, reason: string): Promise<void> {
    if (live.claimed) return;
    await this.conn.agent.confirmExit({ nodeId: this.#id, reason });
  }

  /** Proposes the agent's own stop; the control plane decides. */
  async proposeStop(condition: string, reason: string): Promise<StopProposal | undefined> {
    const resp = await this.conn.agent.proposeStop({ nodeId: this.#id, condition, reason });
    return resp.proposal;
  }

  /** Derives a narrower grant from one the agent holds, for a node in its subtree. */
  async delegate(parentGrantId: string, childNodeId: string, scopes: string[], ttlMs?: number): Promise<Grant> {
    const resp = await this.conn.capability.delegate({
      parentGrantId,
      holderNodeId: childNodeId,
      scopes,
      ttl: ttlMs ? durationFromMs(ttlMs) : undefined,
    });
    if (!resp.grant) throw new Error("tether: Delegate answered without a grant");
    return printedWithout({ grant: resp.grant, token: resp.token, expiresAt: dateOf(resp.tokenExpiresAt) }, "token");
  }

  /** Mints a fresh short-lived token for a grant the agent holds; the control plane re-checks the whole chain first. */
  async refreshToken(grantId: string): Promise<Grant> {
    const resp = await this.conn.capability.refresh({ grantId });
    if (!resp.grant) throw new Error("tether: Refresh answered without a grant");
    return printedWithout({ grant: resp.grant, token: resp.token, expiresAt: dateOf(resp.tokenExpiresAt) }, "token");
  }

  /**
   * A source of always-fresh capability tokens for a grant this agent holds:
   * see {@link CapabilityToken}.
   */
  capabilityToken(grant: Grant, options?: CapabilityTokenOptions): CapabilityToken {
    return new CapabilityToken(this, grant, options);
  }

  /** Closes the agent's connection. */
  close(): void {
    this.conn.close();
  }

  toString(): string {
    return `${this.#node.name} (${this.#id})`;
  }
}

/** Options for {@link CapabilityToken}. */
export interface CapabilityTokenOptions {
  /** Milliseconds since the epoch (default Date.now); tests inject a clock. */
  now?: () => number;
}

/**
 * Keeps a capability token fresh: {@link CapabilityToken.get} returns the
 * current token, first refreshing it (CapabilityService.Refresh, which
 * re-checks the chain) once less than a third of its life is left.
 * Concurrent callers share one refresh. A refusal (the grant was revoked,
 * the node is stopping) is thrown to the caller: there is no token to use.
 */
export class CapabilityToken {
  #agent: Agent;
  #grant: Grant;
  #issuedAt: number;
  #now: () => number;
  #refreshing?: Promise<Grant>;

  constructor(agent: Agent, grant: Grant, options: CapabilityTokenOptions = {}) {
    this.#agent = agent;
    this.#grant = grant;
    this.#now = options.now ?? Date.now;
    this.#issuedAt = this.#now();
  }

  get grantId(): string {
    return this.#grant.grant.grantId;
  }

  get scopes(): string[] {
    return this.#grant.grant.scopes;
  }

  /** The grant as last refreshed. */
  get grant(): Grant {
    return this.#grant;
  }

  async get(): Promise<string> {
    const now = this.#now();
    const expires = this.#grant.expiresAt.getTime();
    const life = Math.max(expires - this.#issuedAt, 0);
    if (expires - now > life / 3) return this.#grant.token;
    this.#refreshing ??= this.#agent.refreshToken(this.grantId).finally(() => (this.#refreshing = undefined));
    const fresh = await this.#refreshing;
    if (fresh !== this.#grant) {
      this.#grant = fresh;
      this.#issuedAt = now;
    }
    return fresh.token;
  }
}
