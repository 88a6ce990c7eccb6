// The forty-sixth hostile pass on the @openai/agents adapter: an agent
// run as a tool (asTool). tetherAgent gated the outer call (the tool
// "research") and ran the agent behind it as it was: its own tools ran
// with no gate inside that one call, as no node of the tree, recorded
// nowhere, needing no scope, and not refused while the run drained. A
// model steered into the agent tool ran, through the drain of the run's
// agent, every tool of the agent behind it ("delete"). And a handoff taken
// by a handoff's target was refused with the default scopes (the child's
// own tools': scope escalation for its own target's), the Python adapter
// now deriving them from what the child reaches.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Agent as OpenAIAgent, setTracingDisabled, tool } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { z } from "zod";

import { runTethered, tetherAgent, tetherAgentTool } from "../src/adapters/openai-agents.js";
import { echo } from "./echo.js";
import { serveTests, TestServer } from "./server.js";

setTracingDisabled(true);
let server: TestServer;
serveTests((s) => (server = s));

function researcher(model: ScriptedModel, ran: string[], onLook: () => Promise<void> = async () => {}) {
  const look = tool({
    name: "look",
    description: "Looks a topic up.",
    parameters: z.object({ topic: z.string() }),
    execute: async () => {
      ran.push("look");
      await onLook();
      return "notes";
    },
  });
  const del = tool({
    name: "delete",
    description: "Deletes a file.",
    parameters: z.object({ path: z.string() }),
    execute: async () => {
      ran.push("delete");
      return "deleted";
    },
  });
  return new OpenAIAgent({ name: "researcher", instructions: "r", tools: [look, del], model });
}

const script = () =>
  new ScriptedModel([
    [functionCall("research", { input: "x" }, { callId: "1" })],
    [functionCall("look", { topic: "x" }, { callId: "2" })],
    [functionCall("delete", { path: "/data" }, { callId: "3" })],
    [assistantMessage("inner done")],
    [assistantMessage("done")],
  ]);

describe("rogue46B: an agent run as a tool", () => {
  test("an asTool agent tool the adapter did not make is refused, not run ungated", async () => {
    const gate = await server.gate("r46b-gate-1");
    const scope = await server.rootScope("triage", gate, ["tool:*"]);
    const model = script();
    const triage = new OpenAIAgent({
      name: "triage",
      instructions: "t",
      tools: [researcher(model, []).asTool({ toolName: "research", toolDescription: "Researches." })],
      model,
    });
    // Before: wrapped, and its run called look and delete with no gate
    // (the ledger held research alone), delete while the run's agent drained.
    assert.throws(() => tetherAgent(scope, triage), /tetherAgentTool/);
    await gate.close();
  });

  test("tetherAgentTool runs the agent as a child of its caller, its tools refused while the run drains", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r46b-gate-2", "triage", ["tool:*"]);
    const model = script();
    const ran: string[] = [];
    const drainTheRun = async () => {
      await server.terminate(scope.agent.nodeId, "drain");
      await TestServer.aborted(scope.drainSignal);
    };
    const research = tetherAgentTool(researcher(model, ran, drainTheRun), { toolName: "research", toolDescription: "Researches." });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [research], model });
    await runTethered(scope, triage, "go");

    const nodes = (await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId })).nodes;
    const child = nodes.find((n) => n.name === "researcher");
    assert.ok(child);
    assert.equal(child.parentNodeId, scope.agent.nodeId);
    // look ran as the child, through the gate; delete, called once the
    // run's agent drained, was refused without running.
    assert.deepEqual(ran, ["look"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [
        ["look", child.nodeId],
        ["research", scope.agent.nodeId],
      ],
    );
    await gate.close();
  });

  test("a handoff a handoff's target takes spawns under it with the default scopes", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r46b-gate-3", "triage", ["tool:*"]);
    const model = new ScriptedModel([
      [functionCall("transfer_to_writer", {}, { callId: "1" })],
      [functionCall("transfer_to_editor", {}, { callId: "2" })],
      [functionCall("publish", { x: "a" }, { callId: "3" })],
      [assistantMessage("done")],
    ]);
    const editor = new OpenAIAgent({ name: "editor", instructions: "e", tools: [echo("publish")], model });
    const writer = new OpenAIAgent({ name: "writer", instructions: "w", tools: [echo("draft")], handoffs: [editor], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", handoffs: [writer], model });
    // Before: the run failed, the editor's delegation refused (scope
    // escalation: tool:publish not covered by the writer's tool:draft).
    const result = await runTethered(scope, triage, "go");
    assert.equal(result.finalOutput, "done");
    const nodes = (await server.operator.agent.listNodes({ rootNodeId: scope.agent.nodeId })).nodes;
    const writerNode = nodes.find((n) => n.name === "writer");
    const editorNode = nodes.find((n) => n.name === "editor");
    assert.ok(writerNode && editorNode);
    assert.equal(editorNode.parentNodeId, writerNode.nodeId);
    assert.deepEqual(recorded.map((c) => [c.tool, c.nodeId]), [["publish", editorNode.nodeId]]);
    await gate.close();
  });
});
