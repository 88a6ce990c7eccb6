// The thirty-seventh hostile pass on the agent SDKs' side of a stop, the
// TypeScript SDK's part, through a real tether server: a drained agent is
// told until when (the control plane never set SessionSignal.deadline), and
// follows the deadline of the stop that holds it, not its first drain's.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { timestampDate } from "@bufbuild/protobuf/wkt";

import { Agent } from "../src/index.js";
import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** Resolves once cond() holds, checked every 20 ms; rejects after ms (a guard against a hang, not a timing). */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  for (let waited = 0; !cond(); waited += 20) {
    if (waited >= ms) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("rogue37a: the drain's deadline", () => {
  test("a rogue parent's day-long drain does not hide the operator's shorter one", async () => {
    const { agent: parent } = await server.rootAgent("rogue37a-rogue-parent");
    const spawned = await parent.spawn("rogue37a-child");
    const child = await Agent.join(server.baseUrl, spawned.credential, { retry: { attempts: 1 } });
    const stop = new AbortController();
    const session = child.run({ signal: stop.signal, heartbeatMs: 500 }).catch(() => {});
    try {
      await child.opened;
      // Drains the child by conn's authority with windows of seconds and
      // returns when the control plane took the request, on its clock.
      const drain = async (conn: typeof parent.conn, seconds: bigint): Promise<Date> => {
        const resp = await conn.supervisor.terminate({
          nodeId: child.nodeId,
          mode: TerminationMode.DRAIN,
          drainWindow: { seconds },
          confirmTimeout: { seconds },
          reason: "rogue37a",
        });
        return timestampDate(resp.termination!.requestedAt!);
      };
      const hour = 3_600_000;
      const parentAsked = await drain(parent.conn, 86_400n);
      await until(() => child.drainDeadline !== undefined, 60_000, "the parent's drain deadline");
      const parents = child.drainDeadline!;
      assert.ok(parents.getTime() > parentAsked.getTime() + hour, `the parent's day-long stop's deadline is ${parents.toISOString()}`);
      const operatorAsked = await drain(server.operator, 60n);
      await until(() => child.drainDeadline !== undefined && child.drainDeadline < parents, 60_000, "the operator's earlier deadline");
      assert.ok(child.drainDeadline!.getTime() < operatorAsked.getTime() + hour, `the operator's minute-long stop's deadline is ${child.drainDeadline!.toISOString()}`);
    } finally {
      stop.abort();
      await session;
      child.conn.close();
    }
  });
});
