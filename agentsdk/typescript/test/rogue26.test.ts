// The twenty-sixth hostile pass on the TypeScript SDK, through a real tether
// server: what the SDK does when the control plane says no to an agent.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import { Agent, StopSignalled } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** p, or a rejection naming what did not happen within ms (a guard against a hang, not a timing). */
function within<T>(p: Promise<T>, ms: number, what: () => string): Promise<T> {
  let timer!: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what()} within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

describe("rogue26: an agent whose exit was confirmed while it was cut off", () => {
  // A launcher attests the agent's exit (ConfirmExit with an operator
  // token) while its process is in fact still there, cut off from the
  // control plane. The control plane refuses the agent's every session from
  // then on (failed_precondition, each kept as evidence contradicting the
  // exit); its signal for such a node is "stop now", but the refusal comes
  // before it. run() took the refusal for a passing fault and reconnected
  // for ever, and agent.signal never aborted: the agent's work went on.
  test("is told to stop, and run() ends with the refusal", async () => {
    const root = await server.rootAgent("rogue26-attested");
    const spawned = await root.agent.spawn("rogue26-attested-child");
    const me = await Agent.join(server.baseUrl, spawned.credential);
    try {
      await server.operator.agent.confirmExit({ nodeId: spawned.node.nodeId, reason: "its process is gone" });
      const warnings: string[] = [];
      const stop = new AbortController();
      const ran = me.run({ signal: stop.signal, heartbeatMs: 200, warn: (m) => warnings.push(m) });
      try {
        const err = await within(
          ran.then(
            () => undefined,
            (e: unknown) => e,
          ),
          10_000,
          () => `run() did not end (it tried again ${warnings.length} times)`,
        );
        assert.ok(err instanceof ConnectError && err.code === Code.FailedPrecondition, `run() ended with ${String(err)}`);
        assert.ok(me.signal.aborted, "the agent's work was not told to stop");
        assert.ok(me.signal.reason instanceof StopSignalled && me.signal.reason.abort, String(me.signal.reason));
        assert.match(me.signal.reason.reason, /exit was confirmed/);
      } finally {
        stop.abort();
        await ran.catch(() => {});
      }
    } finally {
      me.close();
    }
  });
});
