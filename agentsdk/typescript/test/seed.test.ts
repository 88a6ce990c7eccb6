// The seeds' promises (job leases, termination) as they reach a user of the
// TypeScript SDK, played through a real tether server. The Go SDK
// (agentsdk/leaseworker.go, fence.go, toolgate.go) is the reference.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import { Agent, CallResolution, isRefusedStopping, JobEnded, LeaseWorker, TerminalResult, ToolCallCancelled, type Grant } from "../src/index.js";
import { AuditEvent, Outcome } from "../src/gen/tether/v1/lease_pb.js";
import type { ToolCall } from "../src/gen/tether/v1/tool_pb.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;
const cleanups: (() => Promise<void>)[] = [];

before(async () => {
  server = await startServer();
});
after(async () => {
  await Promise.all(cleanups.map((c) => c()));
  await server?.stop();
});

async function family(name: string) {
  const root = await server.rootAgent(name);
  const spawned = await root.agent.spawn(`${name}-child`);
  const child = await Agent.join(server.baseUrl, spawned.credential);
  const stopChild = new AbortController();
  const childSession = child.run({ signal: stopChild.signal, heartbeatMs: 500 }).catch(() => {});
  await child.opened;
  const grant: Grant = await root.agent.delegate(root.grant.grant.grantId, child.nodeId, ["tool:*"], 600_000);
  const close = async () => {
    stopChild.abort();
    root.stopSession.abort();
    await Promise.all([childSession, root.session]);
    child.close();
  };
  cleanups.push(close);
  return { root, child, grant, close };
}

describe("seed: job leases through the TypeScript LeaseWorker", () => {
  test("a job's fencing headers are the ones the Go Fence reads (Tether-Job-Id, Tether-Lease-Generation)", async () => {
    const f = await family("seed-headers");
    const offered = await server.operator.lease.offer({ jobId: "seed-ts-headers", holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const job = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    // agentsdk.HeaderJobID and agentsdk.HeaderLeaseGeneration: a tool server
    // fenced with the Go SDK refuses a request that lacks them.
    assert.deepEqual(job.headers(), { "Tether-Job-Id": "seed-ts-headers", "Tether-Lease-Generation": "1" });
    await job.complete(TerminalResult.SUCCESS, "done");
    await f.close();
  });

  test("a cancel stops the work (signal, onCancel) and is acknowledged once; the job then reports CANCELLED", async () => {
    const f = await family("seed-cancel");
    const jobId = "seed-ts-cancel";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    let onCancel = 0;
    const job = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!, { onCancel: () => void onCancel++ });
    await server.operator.lease.requestCancel({ jobId, reason: "seed" });
    await job.renew();
    assert.ok(job.signal.aborted && job.signal.reason instanceof JobEnded && job.signal.reason.kind === "cancelled", String(job.signal.reason));
    assert.equal(onCancel, 1);
    assert.equal((await server.operator.lease.getLease({ jobId })).lease?.cancelAck, true);
    // The renew loop stopped: a renewal after the cancel sends nothing.
    assert.equal(await job.renew(), undefined);
    assert.equal(onCancel, 1, "onCancel runs once");
    const d = await job.complete(TerminalResult.CANCELLED, "stopped on request");
    assert.equal(d?.outcome, Outcome.ACCEPTED);
    assert.equal((await server.operator.lease.getLease({ jobId })).lease?.terminalResult, TerminalResult.CANCELLED);
    await f.close();
  });

  test("a generation it no longer holds: its progress and result are refused as stale and change nothing", async () => {
    const f = await family("seed-fence");
    const jobId = "seed-ts-fence";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const worker = new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 });
    const old = await worker.accept(offered.lease!);
    const gen2 = await server.operator.lease.reassign({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n }, reason: "restart" });
    const current = await worker.accept(gen2.lease!);
    await current.progress("current");
    const p = await old.progress("zombie");
    assert.equal(p?.outcome, Outcome.REJECTED);
    assert.equal(p?.auditEvent, AuditEvent.STALE_GENERATION);
    assert.ok(old.signal.aborted && (old.signal.reason as JobEnded).kind === "lost", String(old.signal.reason));
    const c = await old.complete(TerminalResult.SUCCESS, "zombie");
    assert.equal(c?.auditEvent, AuditEvent.STALE_GENERATION);
    const got = (await server.operator.lease.getLease({ jobId })).lease!;
    assert.equal(got.progressValue, "current");
    assert.equal(got.terminalResult, TerminalResult.UNSPECIFIED);
    await current.complete(TerminalResult.SUCCESS, "done");
    await f.close();
  });

  test("a restarted worker accepting the job it holds goes on from the sequences the coordinator accepted", async () => {
    // A worker process killed after it renewed and reported progress comes
    // back and accepts the job it still holds (the ACK is a DUPLICATE). Its
    // sequences used to start at 0 again: its renewals were refused
    // STALE_RENEW until the lease lapsed, its reports kept as late progress.
    const f = await family("seed-restart");
    const jobId = "seed-ts-restart";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const before = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    for (const step of ["1", "2", "3"]) {
      assert.equal((await before.renew())?.outcome, Outcome.ACCEPTED);
      assert.equal((await before.progress(`step ${step}`))?.outcome, Outcome.ACCEPTED);
    }
    before.stop(); // the process is gone
    const after = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    const renewed = await after.renew();
    assert.equal(renewed?.outcome, Outcome.ACCEPTED, renewed?.reason);
    const reported = await after.progress("step 4");
    assert.equal(reported?.outcome, Outcome.ACCEPTED, reported?.reason);
    const l = (await server.operator.lease.getLease({ jobId })).lease!;
    // (accept renewed at once, seq 4: a repeated ACK proves no window.)
    assert.deepEqual([l.renewSequence, l.progressSequence, l.progressValue, l.lateProgress], [5n, 4n, "step 4", false]);
    await after.complete(TerminalResult.SUCCESS, "done");
    await f.close();
  });

  test("a restarted worker learns of a cancel from its ACK's answer: the job stops before it begins, the cancel acknowledged", async () => {
    // The coordinator cancelled while the worker process was down; the
    // restarted worker's ACK is a DUPLICATE carrying cancel_requested. The
    // job used to start regardless, and heard of the cancel only from its
    // first renewal's answer.
    const f = await family("seed-restart-cancel");
    const jobId = "seed-ts-restart-cancel";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    (await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!)).stop(); // the process is gone
    await server.operator.lease.requestCancel({ jobId, reason: "stop" });
    let onCancel = 0;
    const job = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!, { onCancel: () => void onCancel++ });
    const cancelled = job.signal.aborted && job.signal.reason instanceof JobEnded && job.signal.reason.kind === "cancelled";
    if (!cancelled) job.stop();
    assert.ok(cancelled, `the job's signal: ${String(job.signal.reason)}`);
    assert.equal(onCancel, 1);
    assert.equal((await server.operator.lease.getLease({ jobId })).lease?.cancelAck, true);
    await job.complete(TerminalResult.CANCELLED, "stopped on request");
    await f.close();
  });

  test("a replayed result is an exact repeat (DUPLICATE); a different detail is refused, not a duplicate", async () => {
    const f = await family("seed-replay");
    const jobId = "seed-ts-replay";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const job = await new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    assert.equal((await job.complete(TerminalResult.SUCCESS, "42 rows"))?.outcome, Outcome.ACCEPTED);
    const again = await job.complete(TerminalResult.SUCCESS, "42 rows");
    assert.equal(again?.outcome, Outcome.DUPLICATE);
    assert.equal(again?.auditEvent, AuditEvent.DUPLICATE_TERMINAL);
    const other = await job.complete(TerminalResult.SUCCESS, "43 rows");
    assert.equal(other?.outcome, Outcome.REJECTED);
    const got = (await server.operator.lease.getLease({ jobId })).lease!;
    assert.equal(got.terminalResult, TerminalResult.SUCCESS);
    assert.match(got.terminalDetail, /: 42 rows$/, "the first result's detail stands (the coordinator prefixes its author)");
    await f.close();
  });
});

describe("seed: termination through the TypeScript ToolGate", () => {
  test("draining refuses a new call without running it and lets the call in flight finish, recorded completed", async () => {
    const gate = await server.gate("seed-ts-drain");
    const f = await family("seed-drain");
    const held = await TestServer.hold(gate, f.grant.token, "held");
    const tid = await server.terminate(f.child.nodeId, "drain");
    let ran = 0;
    await assert.rejects(
      gate.call(f.grant.token, "fresh", () => void ran++),
      (err: unknown) => isRefusedStopping(err),
    );
    assert.equal(ran, 0, "the refused tool did not run");
    held.release();
    await held.done;
    const rec = await server.record(tid);
    const byTool = new Map(rec.toolCalls.map((c) => [c.tool, c.resolution]));
    assert.equal(byTool.get("held"), CallResolution.COMPLETED);
    assert.equal(byTool.get("fresh"), CallResolution.REJECTED_DRAINING);
    await f.close();
  });

  test("aborting cancels the call in flight and acknowledges only the call that stopped; one that finished anyway is completed", async () => {
    const gate = await server.gate("seed-ts-abort");
    const f = await family("seed-abort");
    let startedA!: () => void;
    let startedB!: () => void;
    const a = new Promise<void>((r) => (startedA = r));
    const b = new Promise<void>((r) => (startedB = r));
    const stops = gate.call(f.grant.token, "stops", (signal) => {
      startedA();
      return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
    });
    const finishes = gate.call(f.grant.token, "finishes", (signal) => {
      startedB();
      return new Promise<string>((resolve) => signal.addEventListener("abort", () => resolve("side effect done"), { once: true }));
    });
    await Promise.all([a, b]);
    const tid = await server.terminate(f.child.nodeId, "abort");
    await assert.rejects(stops, (err: unknown) => err instanceof ToolCallCancelled);
    assert.equal(await finishes, "side effect done");
    const rec = await server.record(tid);
    const byTool = new Map(rec.toolCalls.map((c) => [c.tool, [c.resolution, c.acknowledgedBy !== ""]]));
    assert.deepEqual(byTool.get("stops"), [CallResolution.CANCELLED_ACKED, true]);
    assert.deepEqual(byTool.get("finishes"), [CallResolution.COMPLETED, false]);
    await f.close();
  });
});

describe("seed: acknowledgement only for a call with a cancel order", () => {
  test("a call its caller's signal stopped, with no cancel order, is ended failed and never acknowledged", async () => {
    const recorded: ToolCall[] = [];
    const gate = await server.gate("seed-ts-noorder", { onRecorded: (c) => recorded.push(c) });
    const f = await family("seed-noorder");
    const caller = new AbortController();
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    const call = gate.call(
      f.grant.token,
      "noorder",
      (signal) => {
        started();
        return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
      },
      { signal: caller.signal },
    );
    await running;
    caller.abort(new Error("the caller gave up"));
    await assert.rejects(call, /the caller gave up/);
    assert.deepEqual(
      recorded.map((c) => [c.tool, c.resolution, c.acknowledgedBy]),
      [["noorder", CallResolution.FAILED, ""]],
    );
    await f.close();
  });
});

describe("seed: a rate-limit refusal through the TypeScript SDK", () => {
  test("a gated call and a lease report refused resource_exhausted reach the caller as that refusal, the tool not run", async () => {
    // Its own server, with a budget small enough to spend.
    const s = await startServer("--rate-limit", "3");
    try {
      // Its connection retries nothing: the refusal, not the SDK's retry of it.
      const root = await Agent.registerRoot(s.operator, "seed-rate", {}, { retry: { attempts: 1 } });
      const issued = await s.operator.capability.issueRoot({ holderNodeId: root.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
      // A lease report refused for rate (the agent lineage's budget) is thrown, not taken for an answer.
      const offered = await s.operator.lease.offer({ jobId: "seed-ts-rate", holderIdentity: root.nodeId, leaseDuration: { seconds: 30n } });
      const job = await new LeaseWorker({ conn: root.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
      let thrown: unknown;
      for (let i = 0; i < 200 && thrown === undefined; i++) {
        await job.progress(`step ${i}`).catch((err: unknown) => (thrown = err));
      }
      job.stop();
      assert.ok(thrown instanceof ConnectError && thrown.code === Code.ResourceExhausted, `progress refused with ${String(thrown)}`);

      // A gated call refused for rate: the refusal itself, and the tool did not run.
      const gate = await s.gate("seed-rate-gate");
      let ran = 0;
      let refusal: unknown;
      for (let i = 0; i < 200 && refusal === undefined; i++) {
        await gate.call(issued.token, "search", () => void ran++).catch((err: unknown) => (refusal = err));
      }
      assert.ok(refusal instanceof ConnectError, `refused with ${String(refusal)}`);
      assert.equal(refusal.code, Code.ResourceExhausted);
      assert.match(refusal.rawMessage, /rate limit/);
      assert.ok(ran < 200, "the refused call did not run");
      root.close();
    } finally {
      await s.stop();
    }
  });
});
