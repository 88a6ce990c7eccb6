// The @openai/agents adapter's three duties, with the framework's own
// ScriptedModel and a real tether server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent as OpenAIAgent, setTracingDisabled, tool } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { z } from "zod";

import { runTethered } from "../src/adapters/openai-agents.js";
import { CallResolution, StopSignalled, ToolCallCancelled, type ToolCall } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

setTracingDisabled(true); // no tracing exporter: the network reaches only registries
let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("@openai/agents adapter", () => {
  test("every tool call goes through the gate, and a handoff runs as a spawned child with an attenuated grant", async () => {
    const recorded: ToolCall[] = [];
    const gate = await server.gate("oa-gate-1", { onRecorded: (c) => recorded.push(c) });
    const scope = await server.rootScope("triage", gate);
    const search = tool({
      name: "search",
      description: "search the web",
      parameters: z.object({ q: z.string() }),
      execute: async ({ q }) => `results for ${q}`,
    });
    const lookup = tool({
      name: "lookup",
      description: "look a word up",
      parameters: z.object({ word: z.string() }),
      execute: async ({ word }) => `${word}: a definition`,
    });
    const researcher = new OpenAIAgent({
      name: "researcher",
      instructions: "research",
      tools: [search],
      model: new ScriptedModel([[functionCall("search", { q: "tethers" }, { callId: "r1" })], [assistantMessage("researched")]]),
    });
    const triage = new OpenAIAgent({
      name: "triage",
      instructions: "triage",
      tools: [lookup],
      handoffs: [researcher],
      model: new ScriptedModel([
        [functionCall("lookup", { word: "tether" }, { callId: "t1" })],
        [functionCall("transfer_to_researcher", {}, { callId: "t2" })],
      ]),
    });
    const result = await runTethered(scope, triage, "find out about tethers");
    assert.equal(result.finalOutput, "researched");

    const children = await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId });
    const child = children.nodes.find((n) => n.name === "researcher");
    assert.ok(child, "the handoff target is a node in the tree");
    assert.equal(child.parentNodeId, scope.agent.nodeId);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId, c.resolution]),
      [
        ["lookup", scope.agent.nodeId, CallResolution.COMPLETED],
        ["search", child.nodeId, CallResolution.COMPLETED],
      ],
    );
    const grants = await server.operator.capability.listGrants({ holderNodeId: child.nodeId });
    assert.equal(grants.grants.length, 1);
    assert.deepEqual(grants.grants[0].scopes, ["tool:search"], "attenuated to the target's own tools");
    assert.equal(grants.grants[0].parentGrantId, scope.token.grantId);
    await gate.close();
  });

  test("a draining node's tool calls are refused without running, and the model is told", async () => {
    const gate = await server.gate("oa-gate-2");
    const scope = await server.rootScope("drained", gate);
    let ran = false;
    const write = tool({
      name: "write",
      description: "write a file",
      parameters: z.object({ path: z.string() }),
      execute: async () => {
        ran = true;
        return "written";
      },
    });
    const model = new ScriptedModel([[functionCall("write", { path: "/tmp/x" }, { callId: "w1" })], [assistantMessage("stopping")]]);
    const writer = new OpenAIAgent({ name: "writer", instructions: "write", tools: [write], model });
    const held = await TestServer.hold(gate, scope.token);
    const terminationId = await server.terminate(scope.agent.nodeId, "drain");
    await TestServer.aborted(scope.drainSignal);
    const result = await runTethered(scope, writer, "write it");
    assert.equal(result.finalOutput, "stopping");
    assert.equal(ran, false, "the refused tool never ran");
    assert.match(JSON.stringify(model.lastCall?.request.input), /Tether refused the call to write/);
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

  test("aborting the subtree aborts the run and cancels the in-flight tool, which observes it", async () => {
    const gate = await server.gate("oa-gate-3");
    const scope = await server.rootScope("aborted", gate);
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    let observed: unknown;
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    const crawl = tool({
      name: "crawl",
      description: "crawl a site",
      parameters: z.object({ site: z.string() }),
      execute: async (_input, _context, details) => {
        started();
        const signal = details!.signal!;
        await TestServer.aborted(signal);
        observed = signal.reason;
        finish();
        // It stops: the framework passes the signal's reason on, and the
        // gate acknowledges the cancel. (Returning a result here would be
        // recorded completed: the gate cannot know it stopped.)
        throw signal.reason;
      },
    });
    const crawler = new OpenAIAgent({
      name: "crawler",
      instructions: "crawl",
      tools: [crawl],
      model: new ScriptedModel([[functionCall("crawl", { site: "example.org" }, { callId: "c1" })], [assistantMessage("never reached")]]),
    });
    const outcome = runTethered(scope, crawler, "crawl it");
    outcome.catch(() => {}); // it may reject before the assertion below awaits it
    await running;
    const terminationId = await server.terminate(scope.agent.nodeId, "abort");
    await assert.rejects(outcome, "the run is aborted");
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
