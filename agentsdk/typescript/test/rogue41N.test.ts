// The forty-first hostile pass on the TypeScript SDK's LeaseWorker (letter
// N), through a real tether server: a job whose onCancel throws (its
// cleanup failed) never acknowledged the coordinator's cancel request and
// never ended. The error escaped the worker between onCancel and the
// acknowledgement, so the cancel stayed unacknowledged on the coordinator
// (the operator's cancel waited for the lease to run out) and the job's
// done never resolved. The Go worker acknowledges once OnCancel returns,
// and the Python worker logs an on_cancel that raises and acknowledges all
// the same.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { JobEnded, LeaseWorker, TerminalResult } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

for (const [name, thrown, reported] of [
  ["an error", new Error("cleanup failed"), "cleanup failed"],
  // A value whose text itself throws must not escape the report either.
  ["a value with no text", { toString: 1 }, "with a value that has no text"],
] as const) {
  const jobId = `ts-rogue41n-${name.replaceAll(" ", "-")}`;
  test(`rogue41N: a cancel whose onCancel throws ${name} is acknowledged all the same, and the job ends`, async () => {
    const { agent } = await server.rootAgent("rogue41n-holder");
    const offered = await server.operator.lease.offer({ jobId: jobId, holderIdentity: agent.nodeId, leaseDuration: { seconds: 300n } });
    const warnings: string[] = [];
    // No renewals on schedule: the test renews, so each answer is one it sees.
    const worker = new LeaseWorker({ conn: agent.conn, renewEveryMs: 3_600_000, warn: (m) => void warnings.push(m) });
    let onCancelRuns = 0;
    const job = await worker.accept(offered.lease!, {
      onCancel: () => {
        onCancelRuns++;
        throw thrown;
      },
    });
    try {
      await server.operator.lease.requestCancel({ jobId: jobId, reason: "rogue41N" });
      // The renewal's answer carries the cancel request: the worker acts on
      // it. The callback's failure is the worker's to report, not a reason
      // to leave the request unacknowledged.
      await job.renew().catch(() => {});
      assert.equal(onCancelRuns, 1, "onCancel did not run once");
      assert.ok(job.signal.aborted, "the cancelled job's signal did not abort");
      assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "cancelled", String(job.signal.reason));
      const got = await server.operator.lease.getLease({ jobId: jobId });
      assert.equal(got.lease?.cancelAck, true, "the cancel request was never acknowledged (the worker stopped at the throwing onCancel)");
      let ended = false;
      await Promise.race([job.done.then(() => (ended = true)), new Promise<void>((resolve) => setImmediate(resolve))]);
      assert.ok(ended, "the cancelled job's done never resolved");
      assert.ok(warnings.some((w) => w.includes(reported)), `the onCancel failure was not reported: ${JSON.stringify(warnings)}`);
      // Its result is still the worker's to report.
      await job.complete(TerminalResult.CANCELLED, "stopped on request");
      assert.equal((await server.operator.lease.getLease({ jobId: jobId })).lease?.terminalResult, TerminalResult.CANCELLED);
    } finally {
      job.stop();
      await worker.close();
    }
  });
}
