// A stdio MCP server for the rogue47I tests (run as `node mcpFiles.js
// <log>`): MCP's JSON-RPC over stdin/stdout, one message a line, serving
// one tool, `delete`, that appends `delete <path>` to the log file (what it
// ran, seen from outside its process). It answers initialize (with the
// client's protocol version), tools/list, tools/call and ping.
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";

const log = process.argv[2];
const send = (msg: object) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");

createInterface({ input: process.stdin }).on("line", (line) => {
  if (!line.trim()) return;
  const msg = JSON.parse(line) as { id?: number | string; method?: string; params?: any };
  if (msg.id === undefined || msg.method === undefined) return; // a notification, or a response
  switch (msg.method) {
    case "initialize":
      return send({
        id: msg.id,
        result: { protocolVersion: msg.params?.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "files", version: "1" } },
      });
    case "tools/list":
      return send({
        id: msg.id,
        result: {
          tools: [
            {
              name: "delete",
              description: "Deletes a file.",
              inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"], additionalProperties: false },
            },
          ],
        },
      });
    case "tools/call":
      appendFileSync(log, `delete ${msg.params?.arguments?.path}\n`);
      return send({ id: msg.id, result: { content: [{ type: "text", text: "deleted" }] } });
    case "ping":
      return send({ id: msg.id, result: {} });
    default:
      return send({ id: msg.id, error: { code: -32601, message: `no method ${msg.method}` } });
  }
});
