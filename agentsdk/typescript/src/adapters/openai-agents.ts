// Tether for @openai/agents: every function tool goes through the ToolGate
// with the calling node's capability token; a handoff spawns the target as
// a child node with an attenuated grant; the run is aborted when its
// subtree is aborted.
import {
  Agent as OpenAIAgent,
  Handoff,
  attachClientToolSearchExecutor,
  getClientToolSearchExecutor,
  run,
  type AgentToolOptions,
  type Computer,
  type FunctionTool,
  type HostedTool,
  type MCPServer,
  type Tool,
} from "@openai/agents";

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

/** What {@link tetherAgentTool} made a tool of: its agent, asTool's options, and the child's scopes. */
interface AgentToolSpec {
  agent: OpenAIAgent<any, any>;
  asTool: AgentToolOptions<any, any, any>;
  scopes?: string[];
  ttlMs?: number;
}

const agentTools = new WeakMap<object, AgentToolSpec>();
/** The tools gateTool made (an agent tool's among them: gated, and bound). */
const gatedTools = new WeakSet<object>();
/** The function tool each function tool gateTool made was made of. */
const gatedFrom = new WeakMap<object, object>();

/**
 * `agent.asTool(asTool)` for an agent run by {@link tetherAgent} (or
 * reached from one): each call runs agent as a child of the node of the
 * agent calling the tool, spawned for the call, with `scopes` (default:
 * the `scopesFor` option's, or `tool:<name>` for each function tool of it
 * and of the agents it reaches), its tools gated as that child, so that a
 * drain or abort of the caller's subtree stops them. A tool
 * `agent.asTool(...)` made directly ran the agent's tools ungated inside
 * its one gated call; {@link tetherAgent} now refuses one (rogue46B tests).
 */
export function tetherAgentTool<A extends OpenAIAgent<any, any>>(
  agent: A,
  asTool: AgentToolOptions<any, A, any>,
  child: { scopes?: string[]; ttlMs?: number } = {},
): FunctionTool<any, any, any> {
  refuseGeneratingMemory(agent);
  const made = agent.asTool(asTool as any) as unknown as FunctionTool<any, any, any>;
  agentTools.set(made, { agent, asTool, scopes: child.scopes, ttlMs: child.ttlMs });
  return made;
}

/**
 * Whether t is a tool `Agent.asTool` made: @openai/agents marks none
 * publicly, but gives each the `on` of its stream events, which no other
 * function tool has.
 */
function isAgentTool(t: Tool<any>): boolean {
  return t.type === "function" && typeof (t as unknown as { on?: unknown }).on === "function";
}

/** The methods of a Computer that act on it (or read it), each one call of the computer tool. */
const computerActions = ["screenshot", "click", "doubleClick", "drag", "keypress", "move", "scroll", "type", "wait"];

/** computer with each of its actions one gated call of the tool named tool. */
function gatedComputer(scope: () => TetherScope, tool: string, computer: Computer): Computer {
  return new Proxy(computer, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof prop !== "string" || !computerActions.includes(prop) || typeof value !== "function") return value;
      return (...args: unknown[]) => scope().call(tool, () => value.apply(target, args));
    },
  });
}

/**
 * A tool @openai/agents runs in this process that is not a function tool
 * (a local shell, an apply_patch editor, a computer), its executor's each
 * call one gated call of the tool's name, or undefined for a tool that
 * runs at the model provider (a hosted tool). Until the forty-seventh pass
 * every tool but a function tool was returned as it was: a model steered
 * into the shell ran its commands, the editor its deletions, as no node of
 * the tree, recorded nowhere, needing no scope, and not refused while the
 * run drained nor after an operator aborted the child that ran them
 * (rogue47B tests).
 */
function gateLocalTool(scope: () => TetherScope, t: Tool<any>): Tool<any> | undefined {
  switch (t.type) {
    case "shell": {
      if (!t.shell) return undefined; // a hosted shell: run at the provider
      const shell = t.shell;
      return { ...t, shell: { run: (action) => scope().call(t.name, () => shell.run(action)) } };
    }
    case "apply_patch": {
      const editor = t.editor;
      return {
        ...t,
        editor: {
          createFile: (op, ctx) => scope().call(t.name, () => editor.createFile(op, ctx)),
          updateFile: (op, ctx) => scope().call(t.name, () => editor.updateFile(op, ctx)),
          deleteFile: (op, ctx) => scope().call(t.name, () => editor.deleteFile(op, ctx)),
        },
      };
    }
    case "computer": {
      const c = t.computer as any;
      let computer: unknown;
      if (typeof c === "function") computer = async (args: any) => gatedComputer(scope, t.name, await c(args));
      else if (c && typeof c === "object" && typeof c.create === "function" && typeof c.screenshot !== "function") {
        computer = { ...c, create: async (args: any) => gatedComputer(scope, t.name, await c.create(args)) };
      } else computer = gatedComputer(scope, t.name, c);
      return { ...t, computer } as Tool<any>;
    }
    default:
      return undefined;
  }
}

/**
 * Wraps a tool so that each call goes through the gate of the scope
 * current at call time: a function tool's calls, and the calls of a tool
 * that runs here without being one (a local shell, an apply_patch editor,
 * a computer), and a client tool search's searches and the tools they
 * load; a hosted tool runs at the model provider and is returned as it is.
 */
export function gateTool<T extends Tool<any>>(scope: () => TetherScope, t: T, options: TetherAgentOptions = {}): T {
  if (t.type === "hosted_tool" && getClientToolSearchExecutor(t)) return gatedToolSearch(scope, t, options) as T;
  if (t.type !== "function") return (gateLocalTool(scope, t) ?? t) as T;
  let fn = t as unknown as FunctionTool<any, any, any>;
  const spec = agentTools.get(t);
  if (spec) {
    fn = agentToolAs(scope, fn, spec, options);
  } else if (isAgentTool(t) && !gatedTools.has(t)) {
    throw new Error(
      `tether: tool ${fn.name} runs an agent (asTool), whose tools would run ungated inside it; make it with tetherAgentTool(agent, options)`,
    );
  }
  const refusal = options.refusalMessage ?? defaultRefusal;
  const gated: FunctionTool<any, any, any> = {
    ...fn,
    invoke: async (runContext, input, details) => {
      try {
        // The tool sees the gate's signal (the control plane's cancel
        // order for this call, the node's abort) and the framework's (the
        // run's abort, the tool's timeoutMs): with the gate's in place of
        // the framework's, a tool that timed out was told nothing and ran
        // on after the run, which the model was told it had timed out,
        // had ended, recorded completed then (rogue48E test).
        return await scope().call(fn.name, (signal) =>
          fn.invoke(runContext, input, { ...details, signal: details?.signal ? AbortSignal.any([details.signal, signal]) : signal }),
        );
      } catch (err) {
        if (isRefusedStopping(err) || isRefusedToken(err)) {
          const message = refusal(fn.name, err);
          if (message !== undefined) return message;
        }
        throw err;
      }
    },
  };
  gatedTools.add(gated);
  gatedFrom.set(gated, t);
  return gated as unknown as T;
}

/**
 * A client tool search (`toolSearchTool({ execution: "client", execute })`)
 * whose execute, run here each time the model asks for a search, is one
 * gated call of the tool's name (`tool_search`) as the node of scope, and
 * whose every tool loaded (function tools made at run time, which the
 * framework adds to the run and calls when the model asks) is gated as a
 * function tool of the agent is, `tool:<name>`. A search refused (the node
 * is stopping, or its grant is revoked) loads nothing, unless refusalMessage
 * says to throw. Until the forty-eighth pass the adapter took the search
 * for a hosted tool and returned it as it was: a model steered into it ran
 * its execute and every tool it loaded (a registry's `delete`) as no node of
 * the tree, recorded nowhere, needing no scope, not refused while the run
 * drained nor after an operator aborted the child that ran them (rogue48E
 * tests).
 */
function gatedToolSearch(scope: () => TetherScope, t: HostedTool, options: TetherAgentOptions): HostedTool {
  const execute = getClientToolSearchExecutor(t)!;
  const refusal = options.refusalMessage ?? defaultRefusal;
  const gated = attachClientToolSearchExecutor({ ...t }, async (args) => {
    let loaded: Awaited<ReturnType<typeof execute>>;
    try {
      loaded = await scope().call(t.name, () => execute(args));
    } catch (err) {
      if ((isRefusedStopping(err) || isRefusedToken(err)) && refusal(t.name, err) !== undefined) return null;
      throw err;
    }
    if (loaded === null || loaded === undefined) return loaded;
    // A tool of the agent's own the search hands back (a deferred one,
    // from loadDefault, or the tool as the agent was given it) is the
    // agent's gated copy, as this node: a second copy would be another
    // tool of the same name, which the framework refuses.
    const own = (l: Tool<any>) => (gatedTools.has(l) ? l : args.availableTools.find((a) => gatedFrom.get(a) === l));
    return (Array.isArray(loaded) ? loaded : [loaded]).map((l) => own(l) ?? gateTool(scope, l, options));
  });
  gatedTools.add(gated);
  return gated;
}

/**
 * The agent tool spec's agent as scope's node calls it: each call spawns
 * the agent as a child of that node and runs the SDK's own agent tool
 * (asTool, with the options given) of the agent wrapped for that child.
 */
function agentToolAs(scope: () => TetherScope, fn: FunctionTool<any, any, any>, spec: AgentToolSpec, options: TetherAgentOptions): FunctionTool<any, any, any> {
  return {
    ...fn,
    invoke: async (runContext, input, details) => {
      const parent = scope();
      const child = await parent.child(spec.agent.name, {
        scopes: spec.scopes ?? options.scopesFor?.(spec.agent) ?? defaultScopes(spec.agent, parent),
        ttlMs: spec.ttlMs ?? options.childTtlMs,
        labels: { "tether.dev/framework": "openai-agents", "tether.dev/agent-tool": fn.name },
      });
      const inner = wrap(() => child, spec.agent, options, new Map()).asTool(spec.asTool as any) as unknown as FunctionTool<any, any, any>;
      return inner.invoke(runContext, input, details);
    },
  };
}

/**
 * The scope of the tool `tool` an agent's MCP server named `server`
 * serves, `mcp:<server>/<tool>`, as the MCP gateway (`agentsdk/mcpgate`)
 * names an upstream's tools; `mcp:<server>/*` covers every tool the server
 * lists, whenever it lists it.
 */
export const mcpScope = (server: string, tool = "*") => `mcp:${server}/${tool}`;

/** The servers gatedMcpServer made, to the server each wraps. */
const gatedServers = new WeakMap<object, MCPServer>();

/**
 * An agent's MCP server whose every tool call (@openai/agents lists the
 * server's tools at run time and calls `callTool` or `callToolResult` for
 * each one the model asks for) is one gated call of the tool
 * `<server>/<tool>` as the node of scope, its grant checked against
 * `mcp:<server>/<tool>`; the server's other methods are its own (connect
 * and close the server given, as before). Until the forty-seventh pass the
 * adapter kept an agent's `mcpServers` as they were: a model steered into
 * an MCP tool ran it as no node of the tree, recorded nowhere, needing no
 * scope, not refused while the run drained nor after an operator aborted
 * the child that ran it (rogue47I tests).
 */
function gatedMcpServer(scope: () => TetherScope, given: MCPServer): MCPServer {
  const server = gatedServers.get(given) ?? given;
  const gated = new Proxy(server, {
    get(target, prop) {
      const value = Reflect.get(target, prop, target);
      if ((prop !== "callTool" && prop !== "callToolResult") || typeof value !== "function") {
        return typeof value === "function" ? value.bind(target) : value;
      }
      return (tool: string, args: unknown, meta?: unknown, options?: { signal?: AbortSignal }) =>
        scope().call(
          `${target.name}/${tool}`,
          (signal) => value.call(target, tool, args, meta, { ...options, signal: options?.signal ? AbortSignal.any([options.signal, signal]) : signal }),
          mcpScope(target.name, tool),
        );
    },
  });
  gatedServers.set(gated, server);
  return gated;
}

/**
 * A SandboxAgent's capability (`@openai/agents/sandbox`: shell, filesystem,
 * skills, memory) whose tools, made when the framework binds it to the
 * run's sandbox session (`clone()`, then `tools()`, at each run), are each
 * gated as the agent's own are, as the node of scope. Until the
 * forty-eighth pass the adapter gated a sandbox agent's own tools and kept
 * its capabilities as they were: a model steered into the shell
 * capability's `exec_command` ran commands (on the host, with the
 * framework's local sandbox) as no node of the tree, recorded nowhere,
 * needing no scope, not refused while the run drained (rogue48E test).
 */
function gatedCapability<C extends object>(scope: () => TetherScope, capability: C, options: TetherAgentOptions): C {
  return new Proxy(capability, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== "function") return value;
      if (prop === "clone") return () => gatedCapability(scope, value.call(target), options);
      if (prop === "tools") return () => (value.call(target) as Tool<any>[]).map((t) => gateTool(scope, t, options));
      return value;
    },
  });
}

/** A SandboxAgent's capabilities (`@openai/agents/sandbox`), or undefined for an agent that has none. */
const capabilitiesOf = (agent: OpenAIAgent<any, any>): object[] | undefined => {
  const capabilities = (agent as { capabilities?: unknown }).capabilities;
  return Array.isArray(capabilities) ? capabilities : undefined;
};

/**
 * Throws for a SandboxAgent with a memory that generates memories
 * (`memory({ generate })`, the framework's default when given none). When
 * the run's sandbox session stops (in the runner's `finally`: after the
 * run's end, its drain's or abort's included) the framework runs agents of
 * its own, SandboxAgents with its default capabilities (a shell, a
 * filesystem) in the same sandbox, run by its runner with no signal: phase
 * one reads the run's transcript, which the run's model wrote, and phase
 * two consolidates. No node runs them and the adapter cannot reach them.
 * Until the forty-eighth pass a sandbox agent's capabilities were gated and
 * its memory kept: a run drained, or aborted by the operator, had the
 * memory agents run on the host the command its model wrote into the
 * transcript, as no node of the tree (rogue48J tests). A memory that only
 * reads (`memory({ generate: false })`) is kept; the Python adapter refuses
 * the same (`Memory(generate=...)`).
 */
function refuseGeneratingMemory(agent: OpenAIAgent<any, any>): void {
  for (const c of capabilitiesOf(agent) ?? []) {
    const { type, generate } = c as { type?: unknown; generate?: unknown };
    if (type === "memory" && generate !== null && generate !== undefined) {
      throw new Error(
        `tether: sandbox agent ${agent.name} generates memories (memory({ generate })): the framework's memory agents run shell and file tools in the sandbox, steered by the run's transcript, as no node of the tree, after the run and its stop; give it memory({ generate: false }) (reads only) and generate memories outside the tether`,
      );
    }
  }
}

/**
 * The names of the tools one of the framework's sandbox capabilities makes
 * once bound to a session (`shell()`: exec_command, write_stdin;
 * `filesystem()`: view_image, apply_patch; `skills({ lazyFrom })`:
 * load_skill), for a child's default scopes, as the Python adapter's
 * `_capability_tools` names the Python SDK's. A capability of the
 * application's own, or one whose `configureTools` renames its tools, is
 * not known here: its calls need scopes given (`scopesFor`).
 */
function capabilityTools(capability: object): string[] {
  const { type, lazyFrom } = capability as { type?: unknown; lazyFrom?: unknown };
  if (type === "shell") return ["exec_command", "write_stdin"];
  if (type === "filesystem") return ["view_image", "apply_patch"];
  if (type === "skills" && lazyFrom) return ["load_skill"];
  return [];
}

/** Whether t runs here, its calls gated, without being a function tool (a client tool search's execute among them). */
const gatesLocally = (t: Tool<any>) =>
  t.type === "computer" || t.type === "apply_patch" || (t.type === "shell" && !!t.shell) || (t.type === "hosted_tool" && !!getClientToolSearchExecutor(t));

/**
 * `tool:<name>` for each function tool of agent (and each tool gated here
 * without being one: a local shell, an apply_patch editor, a computer, a
 * client tool search, not the tools its searches load, known only then;
 * and each tool the framework's sandbox capabilities of a SandboxAgent make
 * once bound, {@link capabilityTools}: before the forty-eighth pass none,
 * so a handoff to a sandbox agent with a function tool spawned a child
 * whose every exec_command was refused for scope, rogue48J test),
 * `mcp:<server>/*` for each of its MCP servers (whose tools are listed only
 * at run time: every tool the server lists is covered), and
 * of every agent it can
 * hand off to or run as a tool ({@link tetherAgentTool}'s: its scopes
 * when given), and they in turn: what its child node delegates on to the
 * children it spawns, which the control plane refuses to widen. With its
 * own tools' alone, a handoff its target took was refused (scope
 * escalation) unless `scopesFor` said more. A target reaching none gets
 * the parent's scopes.
 */
function defaultScopes(agent: OpenAIAgent<any, any>, parent: TetherScope): string[] {
  const names: string[] = [];
  const add = (s: string) => {
    if (!names.includes(s)) names.push(s);
  };
  const seen = new Set<OpenAIAgent<any, any>>();
  const todo = [agent];
  for (let a = todo.shift(); a !== undefined; a = todo.shift()) {
    if (seen.has(a)) continue;
    seen.add(a);
    for (const t of a.tools) if (t.type === "function" || gatesLocally(t)) add(`tool:${t.name}`);
    for (const c of capabilitiesOf(a) ?? []) capabilityTools(c).forEach((n) => add(`tool:${n}`));
    for (const server of a.mcpServers) add(mcpScope(server.name));
    for (const t of a.tools) {
      const spec = agentTools.get(t);
      if (spec?.scopes) spec.scopes.forEach(add);
      else if (spec) todo.push(spec.agent);
    }
    for (const h of a.handoffs) todo.push(h instanceof Handoff ? h.agent : h);
  }
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
  refuseGeneratingMemory(agent);
  const copy = agent.clone({});
  seen.set(agent, copy);
  copy.tools = agent.tools.map((t) => gateTool(scope, t, options));
  copy.mcpServers = agent.mcpServers.map((server) => gatedMcpServer(scope, server));
  const capabilities = capabilitiesOf(agent);
  if (capabilities) (copy as unknown as { capabilities: object[] }).capabilities = capabilities.map((c) => gatedCapability(scope, c, options));
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
