// The forty-seventh hostile pass on the @openai/agents adapter: the tools
// an agent's MCP servers serve (`new Agent({ mcpServers: [...] })`).
// @openai/agents lists a server's tools at run time and calls the server's
// callTool (or callToolResult) for each one the model asks for; the adapter
// gated the agent's function tools and local tools and kept its MCP servers
// as they were. A model steered into an MCP tool ran it as no node of the
// tree: nothing in the ledger, no scope asked, not refused while the run's
// agent drained, and a handoff target's MCP tool ran on after an operator
// aborted the child the handoff spawned. The server here is a real stdio
// MCP server in a process of its own (test/mcpFiles.ts), reached through
// the framework's MCPServerStdio, which writes down each deletion it made.
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Agent as OpenAIAgent, MCPServerStdio, setTracingDisabled } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";

import { runTethered } from "../src/adapters/openai-agents.js";
import { echoAfter } from "./echo.js";
import { serveTests, type TestServer } from "./server.js";

setTracingDisabled(true);
let server: TestServer;
serveTests((s) => (server = s));

const serverScript = fileURLToPath(new URL("./mcpFiles.js", import.meta.url));

/** The stdio MCP server "files", connected, and the log of what it ran. */
async function files(): Promise<{ mcp: MCPServerStdio; ran: () => string[] }> {
  const log = join(mkdtempSync(join(tmpdir(), "rogue47I-")), "ran.txt");
  const mcp = new MCPServerStdio({ name: "files", command: process.execPath, args: [serverScript, log] });
  await mcp.connect();
  return { mcp, ran: () => (existsSync(log) ? readFileSync(log, "utf8").split("\n").filter((l) => l !== "") : []) };
}

describe("rogue47I: the tools of an agent's MCP servers", () => {
  test("an MCP tool is gated as the run's node and refused while it drains", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r47i-gate-1", "triage", ["tool:*", "mcp:*"]);
    const { mcp, ran } = await files();
    const draining = echoAfter("drain", () => server.drained(scope));
    const model = new ScriptedModel([
      [functionCall("delete", { path: "notes.md" }, { callId: "1" })],
      [functionCall("drain", { x: "a" }, { callId: "2" })],
      [functionCall("delete", { path: "ledger.db" }, { callId: "3" })],
      [assistantMessage("done")],
    ]);
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", tools: [draining], mcpServers: [mcp], model });
    try {
      await runTethered(scope, triage, "go").catch(() => {});
    } finally {
      await mcp.close();
    }
    // Before: ["delete notes.md", "delete ledger.db"], the second after
    // the drain began, the ledger holding "drain" alone.
    assert.deepEqual(ran(), ["delete notes.md"]);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.nodeId]),
      [
        ["files/delete", scope.agent.nodeId],
        ["drain", scope.agent.nodeId],
      ],
    );
    await gate.close();
  });

  test("a handoff target's MCP tool is gated as its child, covered by mcp:<server>/*, refused once the child is aborted", async () => {
    const { recorded, gate, scope } = await server.recordedRootScope("r47i-gate-2", "triage", ["tool:*", "mcp:*"]);
    const { mcp, ran } = await files();
    let child = "";
    const aborting = echoAfter("abort", async () => {
      const editor = await server.abortedChild(scope, (c) => assert.ok(c.scopes.includes("mcp:files/*"), JSON.stringify(c.scopes)));
      child = editor.agent.nodeId;
    });
    const model = new ScriptedModel([
      [functionCall("transfer_to_editor", {}, { callId: "1" })],
      [functionCall("delete", { path: "notes.md" }, { callId: "2" })],
      [functionCall("abort", { x: "a" }, { callId: "3" })],
      [functionCall("delete", { path: "ledger.db" }, { callId: "4" })],
      [assistantMessage("done")],
    ]);
    const editor = new OpenAIAgent({ name: "editor", instructions: "e", tools: [aborting], mcpServers: [mcp], model });
    const triage = new OpenAIAgent({ name: "triage", instructions: "t", handoffs: [editor], model });
    try {
      await runTethered(scope, triage, "go").catch(() => {});
    } finally {
      await mcp.close();
    }
    // Before: ["delete notes.md", "delete ledger.db"], the second after the
    // operator's abort of the child, and neither in the ledger.
    assert.deepEqual(ran(), ["delete notes.md"]);
    assert.deepEqual(recorded.map((c) => [c.tool, c.nodeId]).filter(([t]) => t === "files/delete"), [["files/delete", child]]);
    await gate.close();
  });
});
