// The examples, run as their own processes against a real server and
// stopped mid-run with the CLI's `tether terminate`.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { CallResolution } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const examples = join(dirname(fileURLToPath(import.meta.url)), "..", "examples");

let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

for (const [example, tool] of [
  ["openai-agents", "fetch"],
  ["langgraph", "fetch"],
] as const) {
  describe(`examples/${example}`, () => {
    test("is stopped mid-run by `tether terminate`, and the record shows its tool calls", async () => {
      const child = spawn(process.execPath, [join(examples, `${example}.js`)], {
        env: { ...process.env, TETHER_ADDR: server.baseUrl, TETHER_TOKEN: server.adminToken, PAGE_MS: "60000" },
        stdio: ["ignore", "pipe", "inherit"],
      });
      const exited = once(child, "exit");
      const lines = createInterface({ input: child.stdout! });
      const output: string[] = [];
      let changed = () => {};
      lines.on("line", (line) => {
        output.push(line);
        changed();
      });
      // Wait until the agent is mid-run: a fetch is in flight (the gate
      // runs the tool only once BeginCall answered), and stays so until
      // the abort cancels it.
      await new Promise<void>((resolve, reject) => {
        changed = () => output.some((l) => l.startsWith("fetching page 1")) && resolve();
        exited.then(() => reject(new Error(`the example exited early: ${output.join("\n")}`)));
      });
      const nodeId = output.map((l) => /^node (n_\S+):/.exec(l)?.[1]).find(Boolean);
      assert.ok(nodeId, `no node id in ${JSON.stringify(output)}`);
      const stopped = await server.cli("terminate", nodeId, "--mode", "abort", "--confirm-timeout", "5s", "--wait");
      const terminationId = /termination (t_\S+)/.exec(stopped)?.[1];
      assert.ok(terminationId, stopped);
      const [code] = await exited;
      assert.equal(code, 0);
      assert.ok(output.some((l) => l.startsWith("stopped by tether")), output.join("\n"));
      assert.ok(!output.some((l) => l.startsWith("finished")), "it did not run to the end");

      const record = (await server.operator.supervisor.getRecord({ terminationId })).record!;
      const calls = record.toolCalls.map((c) => [c.tool, c.resolution]);
      assert.deepEqual(calls, [[tool, CallResolution.CANCELLED_ACKED]], `the fetch in flight was cancelled and acknowledged; output:\n${output.join("\n")}\n${stopped}`);
      assert.ok(record.nodes.length >= 2, "the record covers the spawned child too");
    });
  });
}
