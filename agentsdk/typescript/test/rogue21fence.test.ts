// The twenty-first hostile pass on the TypeScript SDK's Fence, through the
// real server, as the Go and Python SDKs' (rogue21 tests there too): a
// rogue caller of a fenced tool naming a job id the coordinator never
// issues (longer than its 256-byte bound, holding a control character)
// had the fence ask the coordinator, and take its invalid_argument for an
// outage (an Error, not a refusal); Fence.observe took a negative, a
// fractional or a 65-bit generation (the last fenced the job's every holder
// out).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, Fence, issuedGenerations, LeaseWorker, MaxJobIdBytes, UnissuedGeneration } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const stops: (() => void)[] = [];
let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  stops.forEach((s) => s());
  await server?.stop();
});

describe("rogue21: a job id no coordinator issues, at a fence", () => {
  test("is refused on its face: nothing asked, nothing remembered", async () => {
    const token = await server.operator.auth.createToken({ toolServer: "ts-rogue21-fenced-tool", ttl: { seconds: 3600n } });
    const tool = server.dial(token.token);
    const check = issuedGenerations(tool);
    let asked = 0;
    const fence = new Fence({ check: (job, generation) => (asked++, check(job, generation)) });

    const long = "j".repeat(MaxJobIdBytes + 1);
    for (const job of [long, "ts-rogue21-\u0001", "ts-rogue21-\u0085", "ts-rogue21-\ud800"]) {
      await assert.rejects(fence.admitHeaders({ "tether-job-id": job, "tether-lease-generation": "1" }), RangeError, `headers naming ${JSON.stringify(job.slice(0, 12))}`);
      await assert.rejects(fence.admit(job, 1n), UnissuedGeneration, `admit of ${JSON.stringify(job.slice(0, 12))}`);
      assert.equal(fence.highest(job), 0n);
    }
    // Named twice (node joins a repeated header with ", "; a Record may carry both).
    await assert.rejects(fence.admitHeaders({ "tether-job-id": "ts-rogue21-j", "tether-lease-generation": "1, 7" }), RangeError);
    await assert.rejects(fence.admitHeaders({ "tether-job-id": "ts-rogue21-j", "tether-lease-generation": ["1", "7"] }), RangeError);
    assert.equal(asked, 0, "the fence asked the coordinator about requests it could refuse on their face");

    // A real job's holder still passes (the fence asks for it).
    const holder = await Agent.registerRoot(server.operator, "ts-rogue21-holder");
    stops.push(() => holder.close());
    const offered = await server.operator.lease.offer({ jobId: "ts-rogue21-fenced", holderIdentity: holder.nodeId, leaseDuration: { seconds: 300n } });
    const worker = new LeaseWorker({ conn: holder.conn, renewEveryMs: 600_000 });
    const job = await worker.accept(offered.lease!);
    stops.push(() => void worker.close());
    await fence.admitHeaders(job.headers());
    assert.equal(asked, 1);
  });

  test("observe takes only a generation a coordinator could issue", () => {
    const fence = new Fence();
    fence.observe("ts-rogue21-seed", 0n); // nothing to raise
    assert.equal(fence.highest("ts-rogue21-seed"), 0n);
    for (const bad of [-1n, 1n << 64n, 1.5 as unknown as bigint, 3 as unknown as bigint]) {
      assert.throws(() => fence.observe("ts-rogue21-seed", bad), RangeError, String(bad));
    }
    assert.equal(fence.highest("ts-rogue21-seed"), 0n);
    fence.observe("ts-rogue21-seed", (1n << 64n) - 1n);
    assert.equal(fence.highest("ts-rogue21-seed"), (1n << 64n) - 1n);
  });
});
