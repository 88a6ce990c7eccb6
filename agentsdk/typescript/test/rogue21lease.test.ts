// The twenty-first hostile pass on the TypeScript SDK's LeaseWorker, as the
// Go and Python SDKs' (rogue21 tests there too), against a peer on loopback
// standing where the control plane would (test/peer.ts):
// - a framework author closing its LeaseWorker at shutdown: there was no
//   close(), only each job's stop(), so a worker's jobs renewed on for as
//   long as the process lived unless each was found and stopped;
// - a lease longer than a node timer can wait (2^31 - 1 ms): node fires
//   such a timer after 1 ms, so the job renewed in a loop and its bound's
//   timer fired early, once.
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Conn, JobEnded, LeaseWorker, TerminalResult, WorkerClosed } from "../src/index.js";
import { AckResponseSchema, AuditEvent, CompleteResponseSchema, LeaseSchema, LeaseState, Outcome, ProgressResponseSchema, RenewResponseSchema } from "../src/gen/tether/v1/lease_pb.js";
import { Peer, unary, until, type Handler } from "./peer.js";

const peers: Peer[] = [];
const stops: (() => void)[] = [];
after(async () => {
  stops.forEach((s) => s());
  for (const p of peers) await p.stop();
});

async function startPeer(handlers: Record<string, Handler>): Promise<Peer> {
  const p = new Peer(handlers);
  await p.start();
  peers.push(p);
  return p;
}

describe("rogue21: LeaseWorker.close()", () => {
  test("ends every job it runs, and sends nothing after", async () => {
    const seen = { ack: 0, renew: 0, progress: 0, complete: 0 };
    const lease = { jobId: "ts-rogue21-close", leaseId: "l1", leaseGeneration: 1n, state: LeaseState.ACTIVE, leaseDuration: { seconds: 300n } };
    const peer = await startPeer({
      Ack: (stream) => (seen.ack++, unary(stream, AckResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.ACKED } })),
      Renew: (stream) => (seen.renew++, unary(stream, RenewResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.RENEWED } })),
      Progress: (stream) => (seen.progress++, unary(stream, ProgressResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED } })),
      Complete: (stream) => (seen.complete++, unary(stream, CompleteResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED } })),
    });
    const conn = Conn.dial(peer.url, "rogue21-agent-token");
    stops.push(() => conn.close());
    const worker = new LeaseWorker({ conn, renewEveryMs: 5 });
    const offered = create(LeaseSchema, { ...lease, state: LeaseState.OFFERED });
    const job = await worker.accept(offered);
    stops.push(() => job.stop());
    await until(() => seen.renew > 0); // it renews

    await worker.close();
    assert.ok(job.signal.aborted, "a job of a closed worker goes on");
    assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "ended", String(job.signal.reason));
    await job.done;
    const renewed = seen.renew;
    await assert.rejects(job.progress("after close"), WorkerClosed);
    await assert.rejects(job.complete(TerminalResult.SUCCESS, "after close"), WorkerClosed);
    await assert.rejects(job.renew(), WorkerClosed);
    await assert.rejects(worker.accept(create(LeaseSchema, { ...lease, jobId: "ts-rogue21-close-2", state: LeaseState.OFFERED })), WorkerClosed);
    assert.deepEqual(seen, { ack: 1, renew: renewed, progress: 0, complete: 0 }, "a closed worker reached the coordinator");
    await worker.close(); // twice is harmless
  });
});

describe("rogue21: a lease longer than a node timer can wait", () => {
  test("its renewals and its bound are timed, not fired at once", async () => {
    // A lease of 90 days (an operator's policy, or a peer gone wrong):
    // renewed every 30 days, past the 2^31 - 1 ms a node timer waits, and
    // node fires such a timer after 1 ms. The job renewed in a loop, and
    // its bound's timer fired once, too early, and was never set again.
    let renewals = 0;
    const lease = { jobId: "ts-rogue21-long", leaseId: "l1", leaseGeneration: 1n, state: LeaseState.ACTIVE, leaseDuration: { seconds: 90n * 86_400n } };
    const peer = await startPeer({
      Ack: (stream) => unary(stream, AckResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.ACKED } }),
      Renew: (stream) => (renewals++, unary(stream, RenewResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.RENEWED } })),
    });
    const conn = Conn.dial(peer.url, "rogue21-agent-token");
    stops.push(() => conn.close());
    const overflows: string[] = [];
    const onWarning = (w: Error) => void (w.name === "TimeoutOverflowWarning" && overflows.push(w.message));
    process.on("warning", onWarning);
    try {
      const worker = new LeaseWorker({ conn });
      const job = await worker.accept(create(LeaseSchema, { ...lease, state: LeaseState.OFFERED }));
      stops.push(() => void worker.close());
      await new Promise((resolve) => setImmediate(resolve)); // a warning is emitted on the next tick
      assert.deepEqual(overflows, [], "a timer was asked to wait longer than node's timers can");
      assert.ok(!job.signal.aborted);
      await worker.close();
    } finally {
      process.off("warning", onWarning);
    }
    assert.equal(renewals, 0);
  });
});
