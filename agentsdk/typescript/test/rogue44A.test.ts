// The forty-fourth hostile pass on the TypeScript SDK's LeaseWorker (letter
// A), the Python worker's fix of the pass brought to TypeScript, through a
// real tether server: a rogue path to the control plane (an interceptor on
// the worker's own HTTP/2 path) forges the lease duration in the answer to
// a job's ACK.
//
// A job took its renew interval (a third of the duration) from the ACK's
// answer and its window from each accepted answer's duration. One forged
// answer naming a day had the job, its path honest from then on, renew
// every 8 hours (the largest a duration holds: every 24.8 days, a timer's
// longest wait): never again within its lease, deaf to its cancel request,
// working on past its lease's expiry at the coordinator for as long.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import type { Interceptor } from "@connectrpc/connect";
import { Conn, JobEnded, LeaseWorker } from "../src/index.js";
import type { AckResponse } from "../src/gen/tether/v1/lease_pb.js";
import { dialThrough } from "./roguepath.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

// dialForging dials the control plane with token over HTTP/2, the answer
// to every ACK passing the rogue path, which puts seconds in its lease's
// duration; it counts the renewals it passes.
function dialForging(token: string, seconds: bigint): { conn: Conn; renewals: () => number; closeSessions: () => void } {
  let renewals = 0;
  const forge: Interceptor = (next) => async (req) => {
    if (req.method.name === "Renew") renewals++;
    const res = await next(req);
    if (req.method.name === "Ack" && !res.stream) {
      const lease = (res.message as AckResponse).lease;
      if (lease) lease.leaseDuration = { ...lease.leaseDuration!, seconds, nanos: 0 };
    }
    return res;
  };
  const { conn, closeSessions } = dialThrough(server.baseUrl, token, forge);
  return { conn, renewals: () => renewals, closeSessions };
}

describe("rogue44A: a forged lease duration does not deafen a job", () => {
  for (const { name, seconds } of [
    { name: "a day's", seconds: 86_400n },
    { name: "the largest", seconds: 315_576_000_000n },
  ]) {
    test(`${name} duration in the ACK's answer: the job still hears its cancel at its first renewal`, async () => {
      const root = await server.rootAgent(`rogue44a-${seconds}`);
      const spawned = await root.agent.spawn(`rogue44a-${seconds}-child`);
      const jobId = `ts-rogue44a-${seconds}`;
      const { conn, renewals, closeSessions } = dialForging(spawned.credential, seconds);
      const worker = new LeaseWorker({ conn }); // the default renew interval: a third of the lease
      try {
        const offered = (await server.operator.lease.offer({ jobId, holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 6n } })).lease!;
        let onCancel = 0;
        const job = await worker.accept(offered, { onCancel: () => void onCancel++ });
        await server.operator.lease.requestCancel({ jobId, reason: "rogue44a" });
        // A guard against the deaf job (ten of its renew intervals), not a timing.
        await within(job.done, 20_000, () => `the job did not hear its cancel request (${renewals()} renewal(s) sent, of a 6 s lease)`);
        const reason = job.signal.reason as JobEnded;
        assert.ok(reason instanceof JobEnded && reason.kind === "cancelled", String(reason));
        assert.equal(onCancel, 1, `onCancel ran ${onCancel} time(s)`);
      } finally {
        await worker.close();
        conn.close();
        closeSessions();
      }
    });
  }
});
