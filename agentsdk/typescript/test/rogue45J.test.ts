// The forty-fifth hostile pass on the @openai/agents adapter: an agent
// reached through two handoffs. tetherAgent wrapped each target once and
// shared the copy between every handoff that reaches it, its tools bound
// to the scope of the handoff wrapped first: a handoff taken through
// another path spawned its child (under the node that took it) and ran the
// target's tools as another node — the child of whichever handoff came
// first, outside the subtree of the agent that handed off (whose stop then
// did not reach them), or none at all (the call failed). A rogue model
// picks the path.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Agent as OpenAIAgent, setTracingDisabled } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";

import { runTethered } from "../src/adapters/openai-agents.js";
import { echo } from "./echo.js";
import { serveTests, type TestServer } from "./server.js";

setTracingDisabled(true);
let server: TestServer;
serveTests((s) => (server = s));

describe("rogue45J: a handoff target reached along two paths", () => {
  test("runs each time as the child its own handoff spawned, under the agent that handed off", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r45j-gate-1", "triage", ["tool:*"]);
    const all = ["tool:lookup", "tool:edit", "tool:publish"];
    // One script for every agent: the run's turns in order.
    const model = new ScriptedModel([
      [functionCall("transfer_to_writer", {}, { callId: "1" })], // triage -> writer (W1 under root)
      [functionCall("publish", { x: "a" }, { callId: "2" })],
      [functionCall("transfer_to_triage", {}, { callId: "3" })], // writer -> triage (under W1)
      [functionCall("transfer_to_editor", {}, { callId: "4" })], // triage -> editor
      [functionCall("transfer_to_writer", {}, { callId: "5" })], // editor -> writer (W2 under the editor)
      [functionCall("publish", { x: "b" }, { callId: "6" })],
      [assistantMessage("done")],
    ]);
    const writer = new OpenAIAgent({ name: "writer", instructions: "w", tools: [echo("publish")], model });
    const editor = new OpenAIAgent({ name: "editor", instructions: "e", tools: [echo("edit")], handoffs: [writer], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [echo("lookup")], handoffs: [writer, editor], model });
    writer.handoffs = [triage];

    const result = await runTethered(scope, triage, "go", { scopesFor: () => all, maxTurns: 20 });
    assert.equal(result.finalOutput, "done");

    const nodes = (await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId })).nodes;
    const path = (id: string): string[] => {
      const n = nodes.find((m) => m.nodeId === id);
      return n ? [...(n.parentNodeId === "" || n.nodeId === scope.agent.nodeId ? [] : path(n.parentNodeId)), n.name] : ["?"];
    };
    const publishes = recorded.filter((c) => c.tool === "publish").map((c) => path(c.nodeId).join("/"));
    // Before: ["triage/writer", "triage/writer"] — the second publish ran
    // as the first handoff's child, under the root, not under the editor
    // that handed off (whose stop did not reach it).
    assert.deepEqual(publishes, ["triage/writer", "triage/writer/triage/editor/writer"]);
    await gate.close();
  });

  test("a target first reached through a second handoff runs its tools as that handoff's child", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r45j-gate-2", "triage", ["tool:*"]);
    const model = new ScriptedModel([
      [functionCall("transfer_to_editor", {}, { callId: "1" })],
      [functionCall("transfer_to_writer", {}, { callId: "2" })],
      [functionCall("publish", { x: "a" }, { callId: "3" })],
      [assistantMessage("done")],
    ]);
    const writer = new OpenAIAgent({ name: "writer", instructions: "w", tools: [echo("publish")], model });
    const editor = new OpenAIAgent({ name: "editor", instructions: "e", tools: [echo("edit")], handoffs: [writer], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [echo("lookup")], handoffs: [writer, editor], model });

    // Before: the run failed, "tether: writer ran before its handoff spawned it".
    const result = await runTethered(scope, triage, "go", { scopesFor: () => ["tool:edit", "tool:publish"] });
    assert.equal(result.finalOutput, "done");
    const nodes = (await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId })).nodes;
    const editorNode = nodes.find((n) => n.name === "editor");
    const writerNode = nodes.find((n) => n.name === "writer");
    assert.ok(editorNode && writerNode);
    assert.equal(writerNode.parentNodeId, editorNode.nodeId);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [["publish", writerNode.nodeId]],
    );
    await gate.close();
  });
});
