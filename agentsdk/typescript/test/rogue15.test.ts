// The fifteenth hostile pass, at the tool (job-lease seed 000 §7, §9, §10,
// §12), for the TypeScript SDK's Fence, through the real server: a holder
// whose job the coordinator cancelled, resolved or saw completed, or that
// was only offered the job, kept writing through a fence that had seen no
// later generation (the check asked once per generation whether it was
// issued). Now the fence refuses it (NoAuthority), as the Go SDK's.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Fence, issuedGenerations, LeaseWorker, NoAuthority, TerminalResult, UnissuedGeneration, type Conn } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;
let tool: Conn;
let holder: { nodeId: string; conn: Conn };
const stops: (() => void)[] = [];

before(async () => {
  server = await startServer();
  const root = await server.rootAgent("rogue15-fence");
  const spawned = await root.agent.spawn("rogue15-fence-worker");
  holder = { nodeId: spawned.node.nodeId, conn: server.dial(spawned.credential) };
  stops.push(() => {
    root.stopSession.abort();
  });
  const token = await server.operator.auth.createToken({ toolServer: "rogue15-fenced-tool-ts", ttl: { seconds: 3600n } });
  tool = server.dial(token.token);
});
after(async () => {
  stops.forEach((s) => s());
  await server?.stop();
});

async function accepted(jobId: string) {
  const offered = await server.operator.lease.offer({ jobId, holderIdentity: holder.nodeId, leaseDuration: { seconds: 300n } });
  const worker = new LeaseWorker({ conn: holder.conn, renewEveryMs: 600_000 });
  const job = await worker.accept(offered.lease!);
  stops.push(() => job.stop());
  return job;
}

describe("rogue15: a fence checks the generation's authority", () => {
  test("a cancelled, resolved, completed or only offered holder is refused; the active holder writes", async () => {
    const fence = new Fence({ check: issuedGenerations(tool) });
    const refused = (reason: string) => (e: unknown) => {
      assert.ok(e instanceof NoAuthority, String(e));
      assert.match(e.message, new RegExp(reason));
      return true;
    };

    const cancelled = await accepted("ts-rogue15-cancelled");
    await fence.admitHeaders(new Headers(cancelled.headers()));
    await server.operator.lease.requestCancel({ jobId: "ts-rogue15-cancelled", reason: "stop" });
    await assert.rejects(fence.admitHeaders(new Headers(cancelled.headers())), refused("cancel"));

    const resolved = await accepted("ts-rogue15-resolved");
    await fence.admitHeaders(new Headers(resolved.headers()));
    await server.operator.lease.requestCancel({ jobId: "ts-rogue15-resolved", reason: "stop" });
    await server.operator.lease.resolve({ jobId: "ts-rogue15-resolved", result: TerminalResult.CANCELLED, reason: "never confirmed" });
    await assert.rejects(fence.admitHeaders(new Headers(resolved.headers())), refused("TERMINAL"));

    const done = await accepted("ts-rogue15-done");
    await fence.admitHeaders(new Headers(done.headers()));
    await done.complete(TerminalResult.SUCCESS, "done");
    await assert.rejects(fence.admitHeaders(new Headers(done.headers())), refused("TERMINAL"));

    const offered = await server.operator.lease.offer({ jobId: "ts-rogue15-offered", holderIdentity: holder.nodeId, leaseDuration: { seconds: 300n } });
    await assert.rejects(fence.admit("ts-rogue15-offered", offered.lease!.leaseGeneration), refused("OFFERED"));
    await assert.rejects(fence.admit("ts-rogue15-done", 2n), UnissuedGeneration);

    const active = await accepted("ts-rogue15-active");
    await fence.admitHeaders(new Headers(active.headers()));
    await fence.admitHeaders(new Headers(active.headers()));
  });

  test("with maxStaleMs an active answer is trusted that long from the ask, then asked again", async () => {
    let nowMs = 1_000_000;
    let asks = 0;
    const ask = issuedGenerations(tool);
    const fence = new Fence({
      maxStaleMs: 10_000,
      clock: { now: () => nowMs },
      check: (job, generation) => {
        asks++;
        return ask(job, generation);
      },
    });
    const job = await accepted("ts-rogue15-stale");
    const headers = new Headers(job.headers());
    await fence.admitHeaders(headers);
    await fence.admitHeaders(headers);
    assert.equal(asks, 1, "an active answer within maxStaleMs was not trusted");
    await server.operator.lease.requestCancel({ jobId: "ts-rogue15-stale", reason: "stop" });
    nowMs += 9_999;
    await fence.admitHeaders(headers); // within the stated bound
    assert.equal(asks, 1);
    nowMs += 1;
    await assert.rejects(fence.admitHeaders(headers), NoAuthority);
    await assert.rejects(fence.admitHeaders(headers), NoAuthority);
    assert.equal(asks, 3, "a refusal was kept instead of asked again");
  });
});
