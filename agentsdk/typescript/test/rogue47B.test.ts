// The forty-seventh hostile pass on the @openai/agents adapter: the tools
// @openai/agents runs in this process that are not function tools. gateTool
// gated function tools and returned every other tool as it was ("hosted
// tools run at the model provider, not here"), but a shell tool (shellTool
// with a local Shell), an apply_patch tool (applyPatchTool with an Editor)
// and a computer tool (computerTool) run here, on the host, each call the
// model asks for. A model steered into one ran shell commands and wrote
// files as no node of the tree: nothing in the ledger, no scope asked, not
// refused while the run's agent drained, and a handoff target's shell ran
// on after an operator's abort of its child.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  Agent as OpenAIAgent,
  applyPatchTool,
  computerTool,
  setTracingDisabled,
  shellTool,
  type Computer,
  type Editor,
  type Shell,
} from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";

import { runTethered } from "../src/adapters/openai-agents.js";
import { echoAfter } from "./echo.js";
import { serveTests, type TestServer } from "./server.js";

setTracingDisabled(true);
let server: TestServer;
serveTests((s) => (server = s));

const shellCall = (callId: string, ...commands: string[]) =>
  ({ type: "shell_call", callId, status: "completed", action: { commands } }) as const;
const patchCall = (callId: string, path: string) =>
  ({ type: "apply_patch_call", callId, status: "completed", operation: { type: "delete_file", path } }) as const;

/** A local Shell that records each command it runs. */
const recordingShell = (ran: string[]): Shell => ({
  run: async (action) => {
    ran.push(...action.commands);
    return { output: action.commands.map(() => ({ stdout: "ok", stderr: "", outcome: { type: "exit" as const, exitCode: 0 } })) };
  },
});

/** An Editor that records each file it deletes. */
const recordingEditor = (ran: string[]): Editor => ({
  createFile: async (op) => void ran.push(`create ${op.path}`),
  updateFile: async (op) => void ran.push(`update ${op.path}`),
  deleteFile: async (op) => void ran.push(`delete ${op.path}`),
});

describe("rogue47B: the local tools that are not function tools", () => {
  test("a local shell tool's commands are gated as the run's node and refused while it drains", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r47b-gate-1", "triage", ["tool:*"]);
    const ran: string[] = [];
    const draining = echoAfter("drain", () => server.drained(scope));
    const model = new ScriptedModel([
      [shellCall("1", "ls /data")],
      [functionCall("drain", { x: "a" }, { callId: "2" })],
      [shellCall("3", "rm -rf /data")],
      [assistantMessage("done")],
    ]);
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [shellTool({ shell: recordingShell(ran) }), draining], model });
    await runTethered(scope, triage, "go");
    // Before: ["ls /data", "rm -rf /data"], the ledger holding "drain" alone.
    assert.deepEqual(ran, ["ls /data"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [
        ["shell", scope.agent.nodeId],
        ["drain", scope.agent.nodeId],
      ],
    );
    await gate.close();
  });

  test("an apply_patch tool's edits are gated as the child a handoff spawned, refused once its child is aborted", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r47b-gate-2", "triage", ["tool:*"]);
    const ran: string[] = [];
    let child = "";
    const aborting = echoAfter("abort", async () => {
      child = (await server.abortedChild(scope)).agent.nodeId;
    });
    const model = new ScriptedModel([
      [functionCall("transfer_to_editor", {}, { callId: "1" })],
      [patchCall("2", "notes.md")],
      [functionCall("abort", { x: "a" }, { callId: "3" })],
      [patchCall("4", "ledger.db")],
      [assistantMessage("done")],
    ]);
    const editor = new OpenAIAgent({ name: "editor", instructions: "e", tools: [applyPatchTool({ editor: recordingEditor(ran) }), aborting], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", handoffs: [editor], model });
    await runTethered(scope, triage, "go").catch(() => {});
    // Before: ["delete notes.md", "delete ledger.db"], the second after the
    // operator's abort of the child, and neither in the ledger.
    assert.deepEqual(ran, ["delete notes.md"]);
    assert.deepEqual(recorded.map((c) => [c.tool, c.nodeId]).filter(([t]) => t === "apply_patch"), [["apply_patch", child]]);
    await gate.close();
  });

  test("a computer tool's actions are gated as the run's node", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r47b-gate-3", "triage", ["tool:*"]);
    const ran: string[] = [];
    const computer = {
      environment: "linux",
      dimensions: [800, 600],
      screenshot: async () => (ran.push("screenshot"), "aGk="),
      click: async (x: number, y: number) => void ran.push(`click ${x},${y}`),
      doubleClick: async () => {},
      scroll: async () => {},
      type: async () => {},
      wait: async () => {},
      move: async () => {},
      keypress: async () => {},
      drag: async () => {},
    } as unknown as Computer;
    const model = new ScriptedModel([
      [{ type: "computer_call", callId: "1", status: "completed", action: { type: "click", x: 1, y: 2, button: "left" } } as never],
      [assistantMessage("done")],
    ]);
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [computerTool({ computer })], model });
    await runTethered(scope, triage, "go");
    assert.ok(ran.includes("click 1,2"), `ran ${JSON.stringify(ran)}`);
    // Before: no call in the ledger.
    assert.ok(recorded.length > 0 && recorded.every((c) => c.tool === "computer_use_preview" && c.nodeId === scope.agent.nodeId), JSON.stringify(recorded.map((c) => c.tool)));
    await gate.close();
  });
});
