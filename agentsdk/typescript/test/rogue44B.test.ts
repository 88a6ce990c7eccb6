// The forty-fourth hostile pass on the TypeScript SDK (letter B), through a
// real tether server and a rogue path in front of it (an interceptor on the
// SDK's own HTTP/2 transport): the gate and the lease worker are not
// deafened, nor kept working, by a path that holds back the control plane's
// word, as the Go and Python SDKs are not since the forty-third pass
// (rogue43l, rogue43U).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { CancelWatchRefreshMs, JobEnded, LeaseWorker, ToolGate } from "../src/index.js";
import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import { type ToolCall, type WatchCancelsResponse } from "../src/gen/tether/v1/tool_pb.js";
import { until } from "./peer.js";
import { callUntilCancelled, type CallUntilCancelled, dialThrough } from "./roguepath.js";
import { startServer, type TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue44B: a silent cancel stream does not deafen the gate", () => {
  // A hostile element on a tool server's path (a proxy that stalls the
  // stream, a peer) relays the opening of the gate's WatchCancels stream
  // and then nothing, holding it open. The stream carries cancel orders
  // only, so its silence is what an honest control plane with nothing to
  // cancel sends too: the TypeScript gate waited on it for good, deaf to
  // every cancel order even once the path was honest again, and the agent
  // being stopped had its tool run on past the cancel its abort ordered
  // (the abort recording the gate's cancel unacknowledged). Now a gate with
  // a call in flight (or a begin under way) opens its stream anew every
  // cancelWatchRefreshMs (CancelWatchRefreshMs, 15 s, the Go gate's
  // CancelWatchRefresh), and the control plane sends every pending order
  // again on the new stream.
  test("a path that relays the stream's opening and then nothing", async () => {
    assert.equal(CancelWatchRefreshMs, 15_000);
    const { agent, grant } = await server.rootAgent("rogue44b-gate");
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue44b", ttl: { seconds: 3600n } });
    // The first WatchCancels stream: its headers relayed, then silence
    // until the gate gives it up; every later one relayed honestly.
    let opened = 0;
    const stalling: Interceptor = (next) => async (req) => {
      if (req.method.name !== "WatchCancels") return next(req);
      const first = ++opened === 1;
      const res = await next(req);
      if (!first || !res.stream) return res;
      const signal = req.signal;
      const messages = async function* (): AsyncGenerator<WatchCancelsResponse> {
        if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        throw new ConnectError("the path held the gate's cancel orders (rogue44B)", Code.Canceled);
      };
      return { ...res, message: messages() } as typeof res;
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, minted.token, stalling);
    const recorded: ToolCall[] = [];
    // The refresh interval injected short: 400 of them fit in the guard.
    const gate = new ToolGate(conn, "gate-rogue44b", { onRecorded: (c) => recorded.push(c), cancelWatchRefreshMs: 50 });
    let held: CallUntilCancelled | undefined;
    try {
      await gate.ready;
      assert.equal(opened, 1);
      held = callUntilCancelled(gate, grant.token);
      await held.running;
      const term = await server.operator.supervisor.terminate({
        nodeId: agent.nodeId,
        mode: TerminationMode.ABORT,
        cancelAckTimeout: { seconds: 3600n },
        reason: "rogue44B",
      });
      assert.ok(term.termination?.terminationId);
      // A guard against the hang, not a timing: 20 s is 400 refresh intervals.
      await held.cancelled(
        () => `the gate is deaf: its tool still running 20 s (400 refresh intervals) after its abort was ordered; ${opened} WatchCancels stream(s) opened, the stalled one still waited on`,
        recorded,
      );
      assert.ok(opened >= 2, `the order heard on ${opened} stream(s): the stalled one relayed it`);
    } finally {
      held?.release();
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});

describe("rogue44B: the lease worker stops a job whose credential is dead", () => {
  // The agent being stopped holds a job under a LeaseWorker, and its path
  // to the control plane withholds its lease traffic while its node is
  // aborted: the stop's cancel request never reaches the job, and the stop
  // ends all the same (the operator confirms the exit, the record is
  // written, the node's credential refused). Once the path is honest again
  // every renewal is refused unauthenticated, and the TypeScript worker
  // warned of each and went on: the job's work ran for its lease's whole
  // window (here ten minutes) after its stop, where the agent's run would
  // have aborted at the first such refusal. Now the renew loop ends the job
  // on a dead credential (unauthenticated, permission_denied) as on a
  // confirmed exit (failed_precondition), as the Go and Python workers do.
  test("a job whose renewals are refused unauthenticated ends at the first", async () => {
    const root = await server.rootAgent("rogue44b-lease");
    const spawned = await root.agent.spawn("rogue44b-lease-worker");
    let cut = false;
    let refused = 0;
    const path: Interceptor = (next) => async (req) => {
      if (req.service.typeName !== "tether.v1.LeaseService") return next(req);
      if (cut) throw new ConnectError("the path withholds the worker's lease traffic (rogue44B)", Code.Unavailable);
      try {
        return await next(req);
      } catch (err) {
        if (req.method.name === "Renew" && ConnectError.from(err).code === Code.Unauthenticated) refused++;
        throw err;
      }
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, spawned.credential, path);
    const warns: string[] = [];
    // The renew interval injected (each renewal's deadline too: long
    // enough for a loaded machine's answers).
    const worker = new LeaseWorker({ conn, renewEveryMs: 250, warn: (m) => warns.push(m) });
    try {
      const offered = await root.agent.conn.lease.offer({ jobId: "job-rogue44b", holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 600n } });
      const job = await worker.accept(offered.lease!);
      cut = true; // the path withholds the worker's lease traffic
      const term = await server.operator.supervisor.terminate({
        nodeId: spawned.node.nodeId,
        mode: TerminationMode.ABORT,
        cancelAckTimeout: { seconds: 1n },
        confirmTimeout: { seconds: 1n },
        reason: "rogue44B",
      });
      await server.operator.agent.confirmExit({ nodeId: spawned.node.nodeId, reason: "rogue44B" });
      await within(server.record(term.termination!.terminationId), 30_000, "the abort to terminate");
      assert.equal(job.signal.aborted, false, `the job ended (${String(job.signal.reason)}) while its path withheld everything: the test proves nothing`);
      cut = false; // honest again
      const enough = 5;
      await within(
        until(() => job.signal.aborted || refused >= enough),
        30_000,
        () => `the job neither ended nor had its renewals refused (${refused} refused)`,
      );
      assert.ok(job.signal.aborted, `the job still works after its node's stop: ${refused} renewals refused unauthenticated`);
      const reason = job.signal.reason;
      assert.ok(reason instanceof JobEnded && reason.kind === "ended", `the job ended with ${String(reason)}`);
      assert.equal(ConnectError.from(reason.cause).code, Code.Unauthenticated, `the job ended on ${String(reason.cause)}`);
      assert.equal(refused, 1, `${refused} renewals refused before the job ended, want 1`);
      assert.ok(warns.some((w) => w.includes("the job ends")), `no warning says the job ended: ${warns.join(" | ")}`);
    } finally {
      await worker.close();
      conn.close();
      closeSessions();
    }
  });
});
