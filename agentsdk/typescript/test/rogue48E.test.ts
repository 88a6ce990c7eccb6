// The forty-eighth hostile pass on the @openai/agents adapter: the client
// tool search. toolSearchTool({ execution: "client", execute }) is a hosted
// tool to the adapter (gateTool returned it as it was: "hosted tools run at
// the model provider"), but its execute runs here, on the host, each time
// the model asks for a tool_search, and the tools it returns (function
// tools made at run time: a tool registry's, a plugin's) are added to the
// run and called when the model asks for them. A model steered into a
// search loaded a `delete` and ran it as no node of the tree: nothing in the
// ledger, no scope asked, not refused while the run's agent drained, and a
// handoff target's search ran on after an operator's abort of its child.
// And a SandboxAgent's capability tools (below), made at run time too.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Agent as OpenAIAgent, run, setTracingDisabled, tool, toolSearchTool, type Tool } from "@openai/agents";
import { SandboxAgent, shell } from "@openai/agents/sandbox";
import { UnixLocalSandboxClient } from "@openai/agents/sandbox/local";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { z } from "zod";

import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { fakeModel } from "@langchain/core/testing";
import { tool as langchainTool } from "@langchain/core/tools";
import { createReactAgent } from "@langchain/langgraph/prebuilt";

import { gateTools, invokeTethered } from "../src/adapters/langgraph.js";
import { runTethered, tetherAgent } from "../src/adapters/openai-agents.js";
import { CallResolution } from "../src/index.js";
import { echoAfter, exec } from "./echo.js";
import { serveTests, type TestServer } from "./server.js";

setTracingDisabled(true);
let server: TestServer;
serveTests((s) => (server = s));

const searchCall = (callId: string, query: string) =>
  ({ type: "tool_search_call", callId, status: "completed", execution: "client", arguments: { query } }) as never;

/** A function tool named name that records each input it runs on. */
const recording = (name: string, ran: string[]) =>
  tool({
    name,
    description: name,
    parameters: z.object({ x: z.string() }),
    execute: async ({ x }) => {
      ran.push(`${name} ${x}`);
      return "ok";
    },
  });

/**
 * A client tool search whose execute records each search it runs and loads
 * a fresh `delete` tool (a registry's, made at run time) recording into ran.
 */
const registrySearch = (ran: string[]) =>
  toolSearchTool({
    execution: "client",
    execute: ({ toolCall }): Tool<any>[] => {
      ran.push(`search ${JSON.stringify(toolCall.arguments)}`);
      return [recording("delete", ran)];
    },
  });

/**
 * A scope at gate gateName and its run's agent, triage, with
 * registrySearch(ran) and a `drain` tool that drains the scope, its model
 * answering turns.
 */
async function searchingTriage(gateName: string, turns: ConstructorParameters<typeof ScriptedModel>[0]) {
  const { recorded, gate, scope } = await server.recordedRootScope(gateName, "triage", ["tool:*"]);
  const ran: string[] = [];
  const draining = echoAfter("drain", () => server.drained(scope));
  const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [registrySearch(ran), draining], model: new ScriptedModel(turns) });
  return { recorded, gate, scope, ran, triage };
}

/**
 * Runs, at gate gateName, triage with a deferred `lookup` tool of its own
 * (recording into ran) and the client search searchOf(lookup) makes, its
 * model searching and then calling lookup.
 */
async function deferredLookupRun(gateName: string, searchOf: (lookup: Tool<any>) => Tool<any>) {
  const { recorded, gate, scope } = await server.recordedRootScope(gateName, "triage", ["tool:*"]);
  const ran: string[] = [];
  const lookup = { ...recording("lookup", ran), deferLoading: true };
  const model = new ScriptedModel([
    [searchCall("1", "lookup")],
    [functionCall("lookup", { x: "a" }, { callId: "2" })],
    [assistantMessage("done")],
  ]);
  const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [searchOf(lookup), lookup], model });
  await runTethered(scope, triage, "go");
  return { recorded, gate, scope, ran };
}

describe("rogue48E: the client tool search's executor and the tools it loads", () => {
  test("a tool the search loads is gated as the run's node and refused while it drains", async () => {
    const { recorded, gate, scope, ran, triage } = await searchingTriage("r48e-gate-1", [
      [searchCall("1", "cleanup")],
      [functionCall("delete", { x: "/tmp/a" }, { callId: "2" })],
      [functionCall("drain", { x: "a" }, { callId: "3" })],
      [functionCall("delete", { x: "/data" }, { callId: "4" })],
      [assistantMessage("done")],
    ]);
    await runTethered(scope, triage, "go");
    // Before: ['search {"query":"cleanup"}', "delete /tmp/a", "delete /data"],
    // the second delete after the drain, the ledger holding "drain" alone.
    assert.deepEqual(ran, ['search {"query":"cleanup"}', "delete /tmp/a"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [
        ["tool_search", scope.agent.nodeId],
        ["delete", scope.agent.nodeId],
        ["drain", scope.agent.nodeId],
      ],
    );
    await gate.close();
  });

  test("the search itself is refused while the run drains, and loads nothing", async () => {
    const { recorded, gate, scope, ran, triage } = await searchingTriage("r48e-gate-2", [
      [functionCall("drain", { x: "a" }, { callId: "1" })],
      [searchCall("2", "cleanup")],
      [functionCall("delete", { x: "/data" }, { callId: "3" })],
      [assistantMessage("done")],
    ]);
    // The delete the refused search did not load is no tool of the run: the
    // framework ends the run on it (a model asking for a tool it lacks).
    await runTethered(scope, triage, "go").catch(() => {});
    // Before: ['search {"query":"cleanup"}', "delete /data"], both after the
    // drain began, neither in the ledger.
    assert.deepEqual(ran, []);
    assert.deepEqual(
      recorded.map((c) => c.tool),
      ["drain"],
    );
    await gate.close();
  });

  test("a deferred tool of the agent's own the search hands back is gated once, as the run's node", async () => {
    const { recorded, gate, scope, ran } = await deferredLookupRun("r48e-gate-4", () =>
      toolSearchTool({ execution: "client", execute: ({ loadDefault }) => loadDefault(["lookup"]) }),
    );
    assert.deepEqual(ran, ["lookup a"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [
        ["tool_search", scope.agent.nodeId],
        ["lookup", scope.agent.nodeId],
      ],
    );
    await gate.close();
  });

  test("a deferred tool of the agent's own the search returns as it was given is its gated copy", async () => {
    const { recorded, gate, ran } = await deferredLookupRun("r48e-gate-6", (lookup) => toolSearchTool({ execution: "client", execute: () => [lookup] }));
    assert.deepEqual(ran, ["lookup a"]);
    assert.deepEqual(
      recorded.map((c) => c.tool),
      ["tool_search", "lookup"],
    );
    await gate.close();
  });

  test("a handoff target's search and the tools it loads are gated as its child, refused once the child is aborted", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r48e-gate-3", "triage", ["tool:*"]);
    const ran: string[] = [];
    let child = "";
    const aborting = echoAfter("abort", async () => {
      child = (await server.abortedChild(scope)).agent.nodeId;
    });
    const model = new ScriptedModel([
      [functionCall("transfer_to_janitor", {}, { callId: "1" })],
      [searchCall("2", "cleanup")],
      [functionCall("delete", { x: "/tmp/a" }, { callId: "3" })],
      [functionCall("abort", { x: "a" }, { callId: "4" })],
      [functionCall("delete", { x: "/data" }, { callId: "5" })],
      [searchCall("6", "more")],
      [assistantMessage("done")],
    ]);
    const janitor = new OpenAIAgent({ name: "janitor", instructions: "j", tools: [registrySearch(ran), aborting], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", handoffs: [janitor], model });
    // The tools a search loads are known only when it runs: the child's
    // default scopes cannot name them, the caller does.
    await runTethered(scope, triage, "go", { scopesFor: () => ["tool:tool_search", "tool:delete", "tool:abort"] }).catch(() => {});
    // Before: the second delete and the second search ran after the
    // operator's abort of the child, and none of them in the ledger.
    assert.deepEqual(ran, ['search {"query":"cleanup"}', "delete /tmp/a"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]).filter(([t]) => t !== "abort"),
      [
        ["tool_search", child],
        ["delete", child],
      ],
    );
    await gate.close();
  });
});

// A SandboxAgent's capabilities (shell, filesystem, skills, memory) give it
// tools only at run time, bound to the run's sandbox session: the framework
// adds capability.tools() to the agent's own. tetherAgent gated the agent's
// own tools and kept its capabilities as they were, so a model steered into
// the shell capability's exec_command ran commands (on the host, with the
// framework's local sandbox) as no node of the tree, after the run's drain.
describe("rogue48E: a sandbox agent's capability tools", () => {
  test("a shell capability's exec_command is gated as the run's node and refused while it drains", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r48e-gate-5", "builder", ["tool:*"]);
    const dir = mkdtempSync(join(tmpdir(), "r48e-sandbox-"));
    try {
      const draining = echoAfter("drain", () => server.drained(scope));
      const model = new ScriptedModel([
        [exec(`touch ${join(dir, "before")}`, "1")],
        [functionCall("drain", { x: "a" }, { callId: "2" })],
        [exec(`touch ${join(dir, "after")}`, "3")],
        [assistantMessage("done")],
      ]);
      const builder = new SandboxAgent({ name: "builder", instructions: "b", tools: [draining], capabilities: [shell()], model });
      const client = new UnixLocalSandboxClient({ workspaceBaseDir: dir });
      await run(tetherAgent(scope, builder), "go", { signal: scope.signal, sandbox: { client } });
      // Before: both files made, the second after the drain, the ledger
      // holding "drain" alone.
      assert.deepEqual([existsSync(join(dir, "before")), existsSync(join(dir, "after"))], [true, false]);
      assert.deepEqual(
        recorded.map((c) => [c.tool, c.nodeId]),
        [
          ["exec_command", scope.agent.nodeId],
          ["drain", scope.agent.nodeId],
        ],
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
      await gate.close();
    }
  });
});

// gateTool ran the tool with the gate's signal in place of the framework's
// (details.signal: the run's abort, the tool's own timeoutMs): a tool that
// timed out was told nothing and ran on while the run went on without it,
// the model told it had timed out, and the run ended (its children's exits
// claimed) with the call still running, recorded completed afterwards.
describe("rogue48E: the framework's signal reaches a gated tool", () => {
  test("a gated tool hears its timeout, and the ledger records it failed, not completed after the run", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r48e-gate-7", "triage", ["tool:*"]);
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let heard: boolean | undefined;
    const slow = tool({
      name: "slow",
      description: "slow",
      parameters: z.object({ x: z.string() }),
      timeoutMs: 1,
      execute: async (_input, _context, details) => {
        const signal = details?.signal;
        await Promise.race([released, new Promise<void>((resolve) => signal?.addEventListener("abort", () => resolve(), { once: true }))]);
        heard = signal?.aborted ?? false;
        if (signal?.aborted) throw signal.reason;
        return "late";
      },
    });
    const model = new ScriptedModel([[functionCall("slow", { x: "a" }, { callId: "1" })], [assistantMessage("done")]]);
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [slow], model });
    await runTethered(scope, triage, "go");
    // The run has ended (its tool timed out at 1 ms): the tool is let go
    // now, and its call's end waited for.
    release();
    await gate.close();
    // Before: false, the call recorded completed once released, after the
    // run that had been told it timed out.
    assert.equal(heard, true);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.resolution]),
      [["slow", CallResolution.FAILED]],
    );
  });
});

// The LangGraph adapter's gateTools did the same: the tool ran with the
// gate's signal alone, not the graph run's (a ToolNode's config.signal: the
// caller's abort of invokeTethered, a step's timeout), and ran on after the
// graph run was aborted, recorded completed once it returned.
describe("rogue48E: the graph run's signal reaches a LangGraph gated tool", () => {
  test("a gated tool hears the abort of the graph run it was called in", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r48e-gate-8", "planner", ["tool:*"]);
    const stop = new AbortController();
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let heard: boolean | undefined;
    const slow = langchainTool(
      async (_input: { x: string }, config) => {
        const signal = config?.signal;
        stop.abort(new Error("the host stopped the run"));
        await Promise.race([released, new Promise<void>((resolve) => signal?.addEventListener("abort", () => resolve(), { once: true }))]);
        heard = signal?.aborted ?? false;
        if (signal?.aborted) throw signal.reason;
        return "late";
      },
      { name: "slow", description: "slow", schema: z.object({ x: z.string() }) },
    );
    const llm = fakeModel()
      .respond(new AIMessage({ id: "slow-call", content: "", tool_calls: [{ name: "slow", args: { x: "a" }, id: "slow-1", type: "tool_call" }] }))
      .respond(new AIMessage({ id: "slow-answer", content: "done" }));
    const planner = createReactAgent({ llm, tools: gateTools(scope, [slow]) });
    await assert.rejects(invokeTethered(scope, planner, { messages: [new HumanMessage("go")] }, { signal: stop.signal }));
    // The run was aborted: the tool is let go now, and its call's end
    // waited for.
    release();
    await gate.close();
    // Before: false, the call recorded completed once released, after the
    // graph run's abort.
    assert.equal(heard, true);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.resolution]),
      [["slow", CallResolution.FAILED]],
    );
  });
});
