// Tether for @langchain/langgraph: tools (for a ToolNode or createReactAgent)
// go through the ToolGate with the calling node's capability token; a
// subgraph runs as a spawned child node with an attenuated grant; the graph
// run is aborted when its subtree is aborted.
import { tool as langchainTool, type StructuredToolInterface } from "@langchain/core/tools";
import type { RunnableConfig } from "@langchain/core/runnables";

import { isRefusedStopping, isRefusedToken } from "../errors.js";
import { TetherScope } from "../scope.js";

/** Options for {@link gateTools}. */
export interface GateToolsOptions {
  /**
   * What a refused call (the node is stopping, or its grant is revoked)
   * returns to the model instead of running the tool; default a sentence
   * saying so. Return undefined to throw the refusal instead.
   */
  refusalMessage?: (tool: string, err: unknown) => string | undefined;
}

const defaultRefusal = (tool: string, err: unknown) =>
  `Tether refused the call to ${tool}: ${err instanceof Error ? err.message : String(err)}. Do not retry; finish up.`;

type ScopeRef = TetherScope | (() => TetherScope);
const resolve = (s: ScopeRef) => (typeof s === "function" ? s() : s);

/**
 * Wraps tools so that each call goes through scope's gate with scope's
 * capability token. The tool runs with the gate's signal in its config
 * (the control plane's cancel order for the call, the node's abort) and
 * the graph run's (the caller's abort, a step's timeout): with the gate's
 * alone, a tool ran on after the graph run it was called in was aborted,
 * recorded completed once it returned (rogue48E test).
 */
export function gateTools(scope: ScopeRef, tools: StructuredToolInterface[], options: GateToolsOptions = {}) {
  const refusal = options.refusalMessage ?? defaultRefusal;
  return tools.map((t) =>
    langchainTool(
      async (input: unknown, config?: RunnableConfig) => {
        try {
          return await resolve(scope).call(t.name, (signal) =>
            t.invoke(input as never, { signal: config?.signal ? AbortSignal.any([config.signal, signal]) : signal }),
          );
        } catch (err) {
          if (isRefusedStopping(err) || isRefusedToken(err)) {
            const message = refusal(t.name, err);
            if (message !== undefined) return message;
          }
          throw err;
        }
      },
      { name: t.name, description: t.description, schema: t.schema as never },
    ),
  );
}

/** Options for {@link tetherSubgraph}. */
export interface SubgraphOptions {
  /** The child's scopes: covered by the parent's grant. */
  scopes: string[];
  ttlMs?: number;
}

/** Something a graph node can invoke: a compiled (sub)graph or any runnable. */
export interface Invocable<I, O> {
  invoke(input: I, config?: RunnableConfig): Promise<O>;
}

/**
 * Returns a graph node that runs a subgraph as a spawned child of scope's
 * node: each time the node runs it spawns the child (an attenuated grant of
 * options.scopes), builds the subgraph for it (give its tools to
 * gateTools(child, …)), invokes it with a signal that aborts with the
 * child's subtree, and then ends the child (it confirms its exit).
 */
export function tetherSubgraph<I, O>(scope: ScopeRef, name: string, options: SubgraphOptions, build: (child: TetherScope) => Invocable<I, O>) {
  return async (state: I, config?: RunnableConfig): Promise<O> => {
    const child = await resolve(scope).child(name, { scopes: options.scopes, ttlMs: options.ttlMs, labels: { "tether.dev/framework": "langgraph" } });
    try {
      const signals = [child.signal, config?.signal].filter((s): s is AbortSignal => s !== undefined);
      return await build(child).invoke(state, { ...config, signal: AbortSignal.any(signals) });
    } finally {
      await child.close("subgraph finished");
    }
  };
}

/**
 * Invokes a graph under scope: aborted (through LangGraph's own signal
 * option) when the scope's subtree is aborted; children spawned by
 * subgraphs are ended when it settles.
 */
export async function invokeTethered<I, O>(scope: TetherScope, graph: Invocable<I, O>, input: I, config: RunnableConfig = {}): Promise<O> {
  const signals = [scope.signal, config.signal].filter((s): s is AbortSignal => s !== undefined);
  try {
    return await graph.invoke(input, { ...config, signal: AbortSignal.any(signals) });
  } finally {
    await scope.closeChildren();
  }
}
