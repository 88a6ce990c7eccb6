// The @langchain/langgraph adapter's three duties, with LangChain's own
// scripted fakeModel and a real tether server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { fakeModel } from "@langchain/core/testing";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { createReactAgent } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import { gateTools, invokeTethered, tetherSubgraph } from "../src/adapters/langgraph.js";
import { CallResolution, StopSignalled, ToolCallCancelled, type ToolCall } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** A scripted model: first a call of tool with args, then a final answer. */
function scripted(toolName: string, args: Record<string, unknown>, answer: string) {
  // Explicit message ids: the fake's own are per-model call indexes, and
  // two models in one graph would overwrite each other's messages.
  return fakeModel()
    .respond(new AIMessage({ id: `${toolName}-call`, content: "", tool_calls: [{ name: toolName, args, id: `${toolName}-1`, type: "tool_call" }] }))
    .respond(new AIMessage({ id: `${toolName}-answer`, content: answer }));
}

describe("@langchain/langgraph adapter", () => {
  test("tool nodes call through the gate, and a subgraph runs as a spawned child with an attenuated grant", async () => {
    const recorded: ToolCall[] = [];
    const gate = await server.gate("lg-gate-1", { onRecorded: (c) => recorded.push(c) });
    const scope = await server.rootScope("lg-planner", gate);
    const lookup = tool(async ({ word }) => `${word}: a definition`, { name: "lookup", description: "look a word up", schema: z.object({ word: z.string() }) });
    const search = tool(async ({ q }) => `results for ${q}`, { name: "search", description: "search", schema: z.object({ q: z.string() }) });
    const planner = createReactAgent({ llm: scripted("lookup", { word: "tether" }, "planned"), tools: gateTools(scope, [lookup]) });
    const research = tetherSubgraph(scope, "lg-researcher", { scopes: ["tool:search"] }, (child) =>
      createReactAgent({ llm: scripted("search", { q: "tethers" }, "researched"), tools: gateTools(child, [search]) }),
    );
    const graph = new StateGraph(MessagesAnnotation)
      .addNode("planner", planner)
      .addNode("research", research)
      .addEdge(START, "planner")
      .addEdge("planner", "research")
      .addEdge("research", END)
      .compile();
    const out = await invokeTethered(scope, graph, { messages: [new HumanMessage("find out about tethers")] });
    assert.equal(out.messages.at(-1)?.content, "researched");

    const nodes = await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId });
    const child = nodes.nodes.find((n) => n.name === "lg-researcher");
    assert.ok(child, "the subgraph is a node in the tree");
    assert.equal(child.parentNodeId, scope.agent.nodeId);
    assert.ok(child.exitConfirmedBy, "the finished subgraph's node confirmed its exit");
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId, c.resolution]),
      [
        ["lookup", scope.agent.nodeId, CallResolution.COMPLETED],
        ["search", child.nodeId, CallResolution.COMPLETED],
      ],
    );
    const grants = await server.operator.capability.listGrants({ holderNodeId: child.nodeId });
    assert.deepEqual(grants.grants.map((g) => [g.scopes, g.parentGrantId]), [[["tool:search"], scope.token.grantId]]);
    await gate.close();
  });

  test("a draining node's tool calls are refused without running, and the model is told", async () => {
    const gate = await server.gate("lg-gate-2");
    const scope = await server.rootScope("lg-drained", gate);
    let ran = false;
    const write = tool(
      async () => {
        ran = true;
        return "written";
      },
      { name: "write", description: "write a file", schema: z.object({ path: z.string() }) },
    );
    const agent = createReactAgent({ llm: scripted("write", { path: "/tmp/x" }, "stopping"), tools: gateTools(scope, [write]) });
    const held = await TestServer.hold(gate, scope.token);
    const terminationId = await server.terminate(scope.agent.nodeId, "drain");
    await TestServer.aborted(scope.drainSignal);
    const out = await invokeTethered(scope, agent, { messages: [new HumanMessage("write it")] });
    assert.equal(ran, false, "the refused tool never ran");
    const toolMessage = out.messages.find((m) => m.getType() === "tool");
    assert.match(String(toolMessage?.content), /Tether refused the call to write/);
    held.release();
    await held.done;
    await scope.agent.confirmExit("drained");
    const record = await server.record(terminationId);
    assert.deepEqual(
      record.toolCalls.map((c) => [c.tool, c.resolution]).sort(),
      [["hold", CallResolution.COMPLETED], ["write", CallResolution.REJECTED_DRAINING]],
    );
    await gate.close();
  });

  test("aborting the subtree aborts the graph run and cancels the in-flight tool, which observes it", async () => {
    const gate = await server.gate("lg-gate-3");
    const scope = await server.rootScope("lg-aborted", gate);
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    let observed: unknown;
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    const crawl = tool(
      async (_input, config) => {
        started();
        await TestServer.aborted(config.signal!);
        observed = config.signal!.reason;
        finish();
        return "partial";
      },
      { name: "crawl", description: "crawl a site", schema: z.object({ site: z.string() }) },
    );
    const agent = createReactAgent({ llm: scripted("crawl", { site: "example.org" }, "never reached"), tools: gateTools(scope, [crawl]) });
    const outcome = invokeTethered(scope, agent, { messages: [new HumanMessage("crawl it")] });
    outcome.catch(() => {}); // it may reject before the assertion below awaits it
    await running;
    const terminationId = await server.terminate(scope.agent.nodeId, "abort");
    await assert.rejects(outcome, "the graph run is aborted");
    await finished;
    // The gate's cancel order or the agent's abort, whichever the tool
    // heard first (the scope passes both): either way the call is
    // recorded cancelled and acknowledged.
    assert.ok(
      observed instanceof ToolCallCancelled || (observed instanceof StopSignalled && observed.abort),
      `the tool saw its stop, got ${String(observed)}`,
    );
    const record = await server.record(terminationId);
    assert.deepEqual(record.toolCalls.map((c) => [c.tool, c.resolution]), [["crawl", CallResolution.CANCELLED_ACKED]]);
    await gate.close();
  });
});
