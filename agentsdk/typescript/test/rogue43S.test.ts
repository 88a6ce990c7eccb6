// The forty-third hostile pass on the TypeScript SDK's LeaseWorker: a rogue
// path to the control plane (a proxy that answers one job's renewals with
// another job's answers: replayed, cached or crossed) against a peer on
// loopback standing where the control plane would (test/peer.ts).
//
// A job judged an answer by its generation and state only. Generations
// count per job (every job's first is 1), so another job's answer of the
// same generation passed for the job's own: an accepted renewal of another
// job moved the job's bound (it worked on with no renewal of its own
// accepted, its lease superseded or expired at the coordinator), and
// another job's cancel request had the job run its onCancel and
// acknowledge a cancel the coordinator never asked of it.
import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Conn, JobEnded, LeaseWorker } from "../src/index.js";
import {
  AckResponseSchema,
  AuditEvent,
  LeaseSchema,
  LeaseServiceCancelAckResponseSchema,
  LeaseState,
  Outcome,
  RenewResponseSchema,
} from "../src/gen/tether/v1/lease_pb.js";
import { Peer, unary, type Handler } from "./peer.js";

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

const own = { jobId: "ts-rogue43S-own", leaseId: "lease-own", leaseGeneration: 1n, state: LeaseState.ACTIVE, leaseDuration: { seconds: 300n } };

// Another job's answer, or another lease's of this job, at the same generation.
const crossed = [
  { name: "another job's", lease: { ...own, jobId: "ts-rogue43S-other", leaseId: "lease-other" } },
  { name: "another lease's", lease: { ...own, leaseId: "lease-other" } },
];

describe("rogue43S: a job does not take another job's answer for its own", () => {
  for (const { name, lease } of crossed) {
    test(`${name} accepted renewal ends the job as lost, and it renews no more`, async () => {
      const seen = { renew: 0 };
      const peer = await startPeer({
        Ack: (stream) => unary(stream, AckResponseSchema, { lease: own, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.ACKED } }),
        Renew: (stream) => (seen.renew++, unary(stream, RenewResponseSchema, { lease, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.RENEWED } })),
      });
      const conn = Conn.dial(peer.url, "rogue43S-agent-token");
      stops.push(() => conn.close());
      // The renew loop waits an hour: the test's renewals are its own,
      // each answered before it goes on.
      const worker = new LeaseWorker({ conn, renewEveryMs: 3_600_000 });
      stops.push(() => void worker.close());
      const job = await worker.accept(create(LeaseSchema, { ...own, state: LeaseState.OFFERED }));
      await job.renew();
      await job.renew(); // a job that ended sends none
      assert.ok(job.signal.aborted, `the job ran on, ${seen.renew} renewals answered with ${name} lease`);
      const reason = job.signal.reason as JobEnded;
      assert.ok(reason instanceof JobEnded && reason.kind === "lost", String(reason));
      assert.match(reason.detail, /names (job|lease)/);
      await job.done;
      assert.equal(seen.renew, 1, "the job renewed after an answer that was not its own");
      assert.equal(job.lease.jobId, own.jobId, "the job keeps another job's lease as its own");
      assert.equal(job.lease.leaseId, own.leaseId, "the job keeps another lease as its own");
      await worker.close();
    });

    test(`${name} cancel request runs no onCancel and is not acknowledged`, async () => {
      const seen = { renew: 0, cancelAck: 0, onCancel: 0 };
      const peer = await startPeer({
        Ack: (stream) => unary(stream, AckResponseSchema, { lease: own, decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.ACKED } }),
        Renew: (stream) =>
          (seen.renew++,
          unary(stream, RenewResponseSchema, {
            lease: { ...lease, cancelRequested: true },
            decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.RENEWED },
          })),
        CancelAck: (stream) => (seen.cancelAck++, unary(stream, LeaseServiceCancelAckResponseSchema, { lease: { ...own, cancelRequested: true, cancelAck: true } })),
      });
      const conn = Conn.dial(peer.url, "rogue43S-agent-token");
      stops.push(() => conn.close());
      const worker = new LeaseWorker({ conn, renewEveryMs: 3_600_000 });
      stops.push(() => void worker.close());
      const job = await worker.accept(create(LeaseSchema, { ...own, state: LeaseState.OFFERED }), {
        onCancel: () => void seen.onCancel++,
      });
      await job.renew(); // its answer acted on (onCancel run, acknowledged) before it returns
      await worker.close(); // every call under way has settled
      assert.deepEqual(
        { onCancel: seen.onCancel, cancelAck: seen.cancelAck },
        { onCancel: 0, cancelAck: 0 },
        `a cancel request in ${name} answer was taken for the job's own`,
      );
      const reason = job.signal.reason as JobEnded;
      assert.ok(reason instanceof JobEnded && reason.kind === "lost", String(reason));
    });
  }
});
