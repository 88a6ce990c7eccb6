// Tether for @openai/agents: every function tool goes through the ToolGate
// with the calling node's capability token; a handoff spawns the target as
// a child node with an attenuated grant; the run is aborted when its
// subtree is aborted.
import { Agent as OpenAIAgent, Handoff, run, type FunctionTool, type Tool } from "@openai/agents";

import { isRefusedStopping, isRefusedToken } from "../errors.js";
import { TetherScope } from "../scope.js";

/** Options for {@link tetherAgent}. */
export interface TetherAgentOptions {
  /**
   * The scopes a handoff target's child node is delegated; default
   * `tool:<name>` for each of the target's function tools. A target with
   * no tools gets the parent's scopes.
   */
  scopesFor?: (agent: OpenAIAgent<any, any>) => string[];
  /** The child grants' lifetime in ms (default 10 minutes). */
  childTtlMs?: number;
  /**
   * What a refused call (the node is stopping, or its grant is revoked)
   * returns to the model instead of running the tool; default a sentence
   * saying so. Return undefined to throw the refusal instead (ending the run).
   */
  refusalMessage?: (tool: string, err: unknown) => string | undefined;
}

const defaultRefusal = (tool: string, err: unknown) =>
  `Tether refused the call to ${tool}: ${err instanceof Error ? err.message : String(err)}. Do not retry; finish up.`;

/** Wraps a function tool so that each call goes through the gate of the scope current at call time. */
export function gateTool<T extends Tool<any>>(scope: () => TetherScope, t: T, options: TetherAgentOptions = {}): T {
  if (t.type !== "function") return t; // hosted tools run at the model provider, not here
  const fn = t as unknown as FunctionTool<any, any, any>;
  const refusal = options.refusalMessage ?? defaultRefusal;
  const gated: FunctionTool<any, any, any> = {
    ...fn,
    invoke: async (runContext, input, details) => {
      try {
        // The tool sees the gate's signal: the control plane's cancel
        // order for this call.
        return await scope().call(fn.name, (signal) => fn.invoke(runContext, input, { ...details, signal }));
      } catch (err) {
        if (isRefusedStopping(err) || isRefusedToken(err)) {
          const message = refusal(fn.name, err);
          if (message !== undefined) return message;
        }
        throw err;
      }
    },
  };
  return gated as unknown as T;
}

function defaultScopes(agent: OpenAIAgent<any, any>, parent: TetherScope): string[] {
  const names = agent.tools.filter((t) => t.type === "function").map((t) => `tool:${t.name}`);
  return names.length > 0 ? names : parent.scopes;
}

/**
 * Returns a copy of agent whose function tools are gated under scope and
 * whose handoffs, when taken, spawn their target as a child of scope's node
 * (with the target's tools gated under the child). Children are tracked on
 * scope: {@link TetherScope.closeChildren} ends them.
 */
export function tetherAgent<A extends OpenAIAgent<any, any>>(scope: TetherScope, agent: A, options: TetherAgentOptions = {}): A {
  return wrap(() => scope, agent, options, new Map()) as A;
}

function wrap(scope: () => TetherScope, agent: OpenAIAgent<any, any>, options: TetherAgentOptions, seen: Map<OpenAIAgent<any, any>, OpenAIAgent<any, any>>): OpenAIAgent<any, any> {
  const done = seen.get(agent);
  if (done) return done;
  const copy = agent.clone({});
  seen.set(agent, copy);
  copy.tools = agent.tools.map((t) => gateTool(scope, t, options));
  copy.handoffs = agent.handoffs.map((h) => {
    const original = h instanceof Handoff ? h : undefined;
    const target = h instanceof Handoff ? h.agent : h;
    // The handoff's face (name, schema, output type) for the framework:
    // never run, its tools bound to no node.
    const face = wrap(() => {
      throw new Error(`tether: ${target.name} ran outside a handoff`);
    }, target, options, seen);
    const wrapped = new Handoff(face, async (context, args) => {
      const parent = scope();
      const child = await parent.child(target.name, {
        scopes: options.scopesFor?.(target) ?? defaultScopes(target, parent),
        ttlMs: options.childTtlMs,
        labels: { "tether.dev/framework": "openai-agents", "tether.dev/handoff-from": agent.name },
      });
      if (original) await original.onInvokeHandoff(context, args);
      // The target runs as the child this handoff spawned, wrapped afresh
      // (and its own handoffs, spawning under it): a copy shared by every
      // handoff reaching the target ran its tools as the node of the
      // handoff wrapped first, outside the subtree of the agent that
      // handed off, whose stop then did not reach them, or as none (the
      // call failed) when that handoff was never taken (rogue45J tests).
      return wrap(() => child, target, options, new Map());
    });
    if (original) {
      wrapped.toolName = original.toolName;
      wrapped.toolDescription = original.toolDescription;
      wrapped.inputJsonSchema = original.inputJsonSchema;
      wrapped.strictJsonSchema = original.strictJsonSchema;
      wrapped.inputFilter = original.inputFilter;
      wrapped.isEnabled = original.isEnabled;
    }
    return wrapped;
  });
  return copy;
}

/**
 * Runs agent under scope: tools gated, handoffs spawned as children, and
 * the run aborted (through the framework's own signal option) when the
 * scope's subtree is aborted. The children are ended when the run settles.
 */
export async function runTethered<A extends OpenAIAgent<any, any>>(
  scope: TetherScope,
  agent: A,
  input: string,
  options: TetherAgentOptions & { maxTurns?: number; signal?: AbortSignal } = {},
) {
  const signals = [scope.signal, options.signal].filter((s): s is AbortSignal => s !== undefined);
  try {
    return await run(tetherAgent(scope, agent, options), input, { maxTurns: options.maxTurns, signal: AbortSignal.any(signals) });
  } finally {
    await scope.closeChildren();
  }
}
