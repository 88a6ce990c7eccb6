// The twenty-second hostile pass on the TypeScript SDK's LeaseWorker, as
// the Go and Python SDKs' (rogue22 tests there too), through a real tether
// server: the operator cancels a job and the agent shuts down, awaiting its
// worker's close() in the job's onCancel. onCancel runs inside the job's
// renewal, and close() waited for that renewal to settle, which it could
// not until onCancel returned: close() resolved only at its 10 s bound,
// with a warning.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { JobEnded, LeaseWorker, type Job } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue22: LeaseWorker.close() from a job's onCancel", () => {
  test("closes the worker, waiting for its other jobs, not for the one whose onCancel called it", async () => {
    const root = await server.rootAgent("rogue22close");
    const spawned = await root.agent.spawn("rogue22close-child");
    const conn = server.dial(spawned.credential);
    const warnings: string[] = [];
    // The loop's tick is also each renewal's deadline, and the cancel is
    // heard in a renewal's answer: a second is a guard against an answer
    // that never comes, where 20 ms was shorter than a loaded machine's
    // answers, every renewal failing deadline_exceeded.
    const worker = new LeaseWorker({ conn, renewEveryMs: 1_000, warn: (m) => warnings.push(m) });
    const offer = async (jobId: string) =>
      (await server.operator.lease.offer({ jobId, holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 60n } })).lease!;
    const other = await worker.accept(await offer("ts-rogue22-other"));
    let closedFromOnCancel!: () => void;
    const closed = new Promise<void>((resolve) => (closedFromOnCancel = resolve));
    let job!: Job;
    job = await worker.accept(await offer("ts-rogue22-cancelled"), {
      onCancel: async () => {
        await worker.close();
        closedFromOnCancel();
      },
    });
    try {
      await server.operator.lease.requestCancel({ jobId: "ts-rogue22-cancelled", reason: "shut down" });
      await closed;
      assert.deepEqual(
        warnings.filter((w) => w.includes("still in flight")),
        [],
        "close() from onCancel waited out its bound for the renewal running that onCancel",
      );
      assert.ok(worker.closed);
      assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "cancelled", String(job.signal.reason));
      assert.ok(other.signal.reason instanceof JobEnded && other.signal.reason.kind === "ended", String(other.signal.reason));
      await job.done;
    } finally {
      job?.stop();
      other.stop();
      await worker.close();
    }
  });
});
