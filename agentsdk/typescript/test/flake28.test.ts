// A flake audit of the TypeScript SDK, as the Go and Python SDKs'
// (TestFlakeNothingIsSentAfterALeaseWorkersCloseReturns,
// test_flake28.py): nothing is sent after a LeaseWorker's close()
// resolves. A job's progress, complete or renewal under way when close()
// was called went out after close() had resolved (an agent that closes its
// worker and then claims its exit had the lease message land after its
// claim, kept as evidence against it): close() did not wait for it.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { LeaseWorker, WorkerClosed } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("flake28: LeaseWorker.close() and the calls under way", () => {
  test("a progress under way as the worker closes goes out before close() resolves", async () => {
    const root = await server.rootAgent("flake28close");
    const spawned = await root.agent.spawn("flake28close-child");
    const conn = server.dial(spawned.credential);
    const worker = new LeaseWorker({ conn, renewEveryMs: 3_600_000 });
    const offered = (await server.operator.lease.offer({ jobId: "ts-flake28-close", holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 60n } })).lease!;
    const job = await worker.accept(offered);
    // The progress's call, once under way, is held while close() runs: every
    // step close() can take without it (its microtasks) runs before the
    // call goes on (a macrotask later).
    const lease = conn.lease as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const progress = lease.progress.bind(conn.lease);
    let closeResolved = false;
    let closedFirst: boolean | undefined;
    let closing: Promise<void> | undefined;
    lease.progress = async (...args: unknown[]) => {
      await Promise.resolve(); // the call is under way: the worker has it
      closing = worker.close().then(() => {
        closeResolved = true;
      });
      await new Promise((resolve) => setImmediate(resolve));
      closedFirst = closeResolved;
      return progress(...args);
    };
    try {
      await job.progress("as the worker closes");
      assert.equal(closedFirst, false, "the progress was sent after the worker's close() had resolved");
    } catch (err) {
      if (!(err instanceof WorkerClosed)) throw err;
    } finally {
      await closing;
      job.stop();
      await worker.close();
    }
  });
});
