import { Code, ConnectError } from "@connectrpc/connect";
import { timestampDate } from "@bufbuild/protobuf/wkt";

import { Agent, CapabilityToken, type Grant } from "./agent.js";
import type { DialOptions } from "./conn.js";
import { ToolGate } from "./toolgate.js";

/** Options for {@link TetherScope.child}. */
export interface ChildOptions {
  /** The child's scopes: must be covered by this scope's grant (the control plane refuses an escalation). */
  scopes: string[];
  /** The child grant's lifetime in ms (default 10 minutes, never past the parent's). */
  ttlMs?: number;
  labels?: Record<string, string>;
}

/**
 * Ends a spawned child that will never run (its grant was refused, or its
 * join failed), as a child process that exits does: its own session opened
 * and closed, and its claim to have exited last. Left as it was, nobody
 * confirmed its exit and the next termination's record counted the honest
 * run's sub-agent unaccounted. Best effort: a child already stopped refuses
 * it, a control plane still out of reach too, and the error that brought
 * us here is what the caller hears. The wait for the session is bounded by
 * the connection's timeoutMs (a session loop that cannot reach the control
 * plane reconnects for ever).
 */
async function endUnused(baseUrl: string, credential: string, dial: DialOptions | undefined, why: string): Promise<void> {
  const stop = new AbortController();
  let agent: Agent | undefined;
  let done: Promise<void> = Promise.resolve();
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    agent = await Agent.join(baseUrl, credential, dial);
    done = agent.run({ signal: stop.signal }).catch(() => {});
    const bound: Promise<void>[] = [];
    if (agent.conn.timeoutMs > 0) bound.push(new Promise((resolve) => (timer = setTimeout(resolve, agent!.conn.timeoutMs))));
    let open = false;
    await Promise.race([agent.opened.then(() => (open = true)), done, ...bound]);
    if (open) await agent.confirmExit(`never ran: ${why}`);
  } catch {
    // The refusal being thrown matters more.
  } finally {
    clearTimeout(timer);
    stop.abort();
    await done;
    agent?.close();
  }
}

/**
 * Where a framework run stands in the Tether tree: the agent node it runs
 * as, the capability token its tools are called with, and the gate that
 * records those calls. Framework adapters turn sub-agents into
 * {@link TetherScope.child} scopes: spawned children with attenuated grants.
 */
export class TetherScope {
  readonly agent: Agent;
  readonly gate: ToolGate;
  readonly token: CapabilityToken;
  readonly parent?: TetherScope;
  readonly #dial?: DialOptions;
  #children: TetherScope[] = [];
  #session?: { stop: AbortController; done: Promise<void>; error?: unknown };

  constructor(agent: Agent, gate: ToolGate, token: CapabilityToken, parent?: TetherScope, dial?: DialOptions) {
    this.agent = agent;
    this.gate = gate;
    this.token = token;
    this.parent = parent;
    this.#dial = dial;
  }

  /**
   * Aborts when this node or any ancestor in the run is aborted (the
   * control plane's abort reaches every node of the subtree).
   */
  get signal(): AbortSignal {
    return this.parent ? AbortSignal.any([this.agent.signal, this.parent.signal]) : this.agent.signal;
  }

  /** Aborts when this node is told to drain (or abort). */
  get drainSignal(): AbortSignal {
    return this.agent.drainSignal;
  }

  /** The scopes this node's grant carries. */
  get scopes(): string[] {
    return this.token.scopes;
  }

  /**
   * Runs fn as one gated tool call with this node's capability token. fn's
   * signal aborts on the control plane's cancel order for the call, heard
   * by the gate, or on this scope's {@link TetherScope.signal} (the node's
   * abort, or an ancestor's in the run), heard by its session, whichever
   * comes first; the gate acknowledges the cancel the control plane
   * ordered either way (the evidence comes from the gate, not from the
   * agent). With the gate's alone, a path that withheld the gate's cancel
   * orders had the tool run on to its end after its agent heard its abort,
   * as neither the Go SDK's Call under the agent's Context nor the Python
   * adapters' run cancelled on the abort let it (rogue43G test).
   */
  call<T>(tool: string, fn: (signal: AbortSignal) => Promise<T> | T, requiredScope?: string): Promise<T> {
    return this.gate.call(this.token, tool, fn, { requiredScope, signal: this.signal });
  }

  /**
   * Spawns a child node under this one, delegates it a narrower grant, and
   * joins it in this process with its own credential and session; the
   * child's calls are recorded under its node. It rejects with the control
   * plane's refusal when the child's session cannot open (the subtree was
   * terminated in between), or when its delegation is refused or its join
   * fails (then after ending the child it spawned, best effort, so that no
   * record counts it unaccounted). It rejects deadline_exceeded when the
   * child's session does not open within the connection's timeoutMs (0:
   * no bound), after stopping that session and claiming the child's exit.
   */
  async child(name: string, options: ChildOptions): Promise<TetherScope> {
    const spawned = await this.agent.spawn(name, options.labels);
    let grant: Grant;
    try {
      grant = await this.agent.delegate(this.token.grantId, spawned.node.nodeId, options.scopes, this.#childTtl(options.ttlMs ?? 600_000));
    } catch (err) {
      await endUnused(this.agent.conn.baseUrl, spawned.credential, this.#dial, "its grant was refused");
      throw err;
    }
    let agent: Agent;
    try {
      agent = await Agent.join(this.agent.conn.baseUrl, spawned.credential, this.#dial);
    } catch (err) {
      // Spawned and granted, but not joined (a transport failure, the
      // subtree stopped in between): it will never run here either.
      await endUnused(this.agent.conn.baseUrl, spawned.credential, this.#dial, "its join failed");
      throw err;
    }
    const scope = new TetherScope(agent, this.gate, agent.capabilityToken(grant), this, this.#dial);
    scope.startSession();
    try {
      await scope.#opened(agent.conn.timeoutMs);
    } catch (err) {
      scope.#session?.stop.abort();
      await scope.#session?.done;
      // A child whose session did not open in time was spawned, granted
      // and joined, and will never run: its exit is claimed (best effort:
      // a control plane out of reach refuses it too), as endUnused does.
      if (err instanceof ConnectError && err.code === Code.DeadlineExceeded) {
        await agent.confirmExit("never ran: its session did not open").catch(() => {});
      }
      agent.close();
      throw err;
    }
    this.#children.push(scope);
    return scope;
  }

  /**
   * A child grant's lifetime, never past this scope's grant: the control
   * plane refuses a delegation that outlives its parent, and 0 asks for
   * the parent's own expiry. Without it every child of a child asked the
   * same ten minutes its parent's grant, delegated a moment before, did
   * not have left: a handoff taken by a handoff's target was refused
   * (invalid_argument) whatever its scopes (rogue45J test).
   */
  #childTtl(ttlMs: number): number {
    const expires = this.token.grant.grant.expiresAt;
    if (!expires) return ttlMs;
    return ttlMs >= timestampDate(expires).getTime() - Date.now() ? 0 : ttlMs;
  }

  /** Keeps this node's session open (signals and credential refresh) until {@link TetherScope.close}. */
  startSession(heartbeatMs?: number): void {
    if (this.#session) return;
    const stop = new AbortController();
    const session: { stop: AbortController; done: Promise<void>; error?: unknown } = { stop, done: Promise.resolve() };
    session.done = this.agent.run({ signal: stop.signal, heartbeatMs }).catch((err: unknown) => {
      session.error = err;
    });
    this.#session = session;
  }

  /**
   * Resolves once this node's session is open, or rejects with the reason
   * the session loop ended without opening one (its node terminated, or its
   * exit confirmed, between the join and the session): the session never
   * opens then, and a wait for it alone held a handoff, and the run behind
   * it, for ever after the stop. With timeoutMs (the connection's; 0: none)
   * it rejects deadline_exceeded once that passed without the session
   * open: a session loop that cannot open one (a control plane out of
   * reach, or a peer that holds the stream without its opening message)
   * reconnects, or waits, for ever, and held the handoff with it.
   */
  async #opened(timeoutMs = 0): Promise<void> {
    const session = this.#session;
    if (!session) return this.agent.opened;
    let open = false;
    let ended = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const bound: Promise<void>[] = [];
    if (timeoutMs > 0) bound.push(new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))));
    try {
      await Promise.race([this.agent.opened.then(() => (open = true)), session.done.then(() => (ended = true)), ...bound]);
    } finally {
      clearTimeout(timer);
    }
    if (open) return;
    if (!ended) throw new ConnectError(`the sub-agent's session did not open within ${timeoutMs} ms`, Code.DeadlineExceeded);
    throw session.error ?? new ConnectError("the sub-agent's session ended before it opened", Code.Unavailable);
  }

  /** The children spawned so far. */
  get children(): readonly TetherScope[] {
    return this.#children;
  }

  /**
   * Ends the children spawned from this scope (and theirs): each confirms
   * its own exit (a claim the record labels as the agent's own), stops its
   * session and closes its connection.
   */
  async closeChildren(reason = "sub-agent finished"): Promise<void> {
    const children = this.#children;
    this.#children = [];
    await Promise.all(children.map((c) => c.close(reason)));
  }

  /** Closes this scope's children, confirms this node's exit, and stops its session. For child scopes. */
  async close(reason = "finished"): Promise<void> {
    await this.closeChildren(reason);
    await this.agent.confirmExit(reason).catch(() => {});
    this.#session?.stop.abort();
    await this.#session?.done;
    this.agent.close();
  }
}
