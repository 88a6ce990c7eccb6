// The seventeenth hostile pass, for the TypeScript SDK's LeaseWorker,
// through the real server: the coordinator's planner (the lineage that
// coordinates the job) claims the active generation its worker holds. The
// coordinator records an ownership conflict and execution halts: the lease
// stays ACTIVE, but renewals no longer extend authority. The job must stop
// on the answer that says so, as the Go worker's does (the Python worker
// ran on until the lease expired).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, JobEnded, LeaseWorker } from "../src/index.js";
import { AuditEvent, LeaseState } from "../src/gen/tether/v1/lease_pb.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;
const stops: (() => void)[] = [];

before(async () => {
  server = await startServer();
});
after(async () => {
  stops.forEach((s) => s());
  await server?.stop();
});

describe("rogue17: a second claimant of a job's active generation", () => {
  test("a recorded ownership conflict ends the job, as lost, naming the conflict", async () => {
    const planner = await Agent.registerRoot(server.operator, "rogue17-planner");
    stops.push(() => planner.close());
    const spawned = await planner.spawn("worker");
    const child = await Agent.join(server.baseUrl, spawned.credential);
    stops.push(() => child.close());
    const jobId = `ts-rogue17-conflict-${child.nodeId}`;
    const offered = (await planner.conn.lease.offer({ jobId, holderIdentity: child.nodeId, leaseDuration: { seconds: 300n } })).lease!;
    const worker = new LeaseWorker({ conn: child.conn, renewEveryMs: 600_000 }); // renewals driven by the test
    const job = await worker.accept(offered);
    stops.push(() => job.stop());

    const claim = await planner.conn.lease.renew({ jobId, leaseId: offered.leaseId, leaseGeneration: offered.leaseGeneration, renewSequence: 1n });
    assert.equal(claim.decision?.auditEvent, AuditEvent.OWNERSHIP_CONFLICT, "the planner's claim");
    assert.equal(job.signal.aborted, false, "the claim alone told the worker nothing; the probe tests nothing");

    const decision = await job.renew();
    assert.equal(decision?.auditEvent, AuditEvent.OWNERSHIP_CONFLICT);
    assert.equal(job.lease.state, LeaseState.ACTIVE);
    assert.equal(job.lease.ownershipConflict, true);
    assert.equal(job.signal.aborted, true, "the job runs on under a recorded ownership conflict");
    const reason = job.signal.reason as JobEnded;
    assert.ok(reason instanceof JobEnded);
    assert.equal(reason.kind, "lost");
    assert.match(reason.detail, /ownership conflict/);
    await job.done;
  });
});
