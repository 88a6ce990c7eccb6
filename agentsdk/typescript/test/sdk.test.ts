// The SDK's promises, played through a real tether server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";

import {
  Agent,
  CallResolution,
  isRefusedStopping,
  JobEnded,
  LeaseWorker,
  StopSignalled,
  TerminalResult,
  Conn,
  ToolCallCancelled,
  ToolGate,
  TokenError,
  Verifier,
  type Grant,
} from "../src/index.js";
import { AuditEvent } from "../src/gen/tether/v1/lease_pb.js";
import { CallState, type ToolCall } from "../src/gen/tether/v1/tool_pb.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;
// What a failed test left open is closed here, so the file still ends.
const cleanups: (() => Promise<void>)[] = [];

before(async () => {
  server = await startServer();
});
after(async () => {
  await Promise.all(cleanups.map((c) => c()));
  await server?.stop();
  if (process.env.TETHER_TS_DEBUG_HANDLES) {
    setTimeout(() => console.error((process as any)._getActiveHandles(), (process as any)._getActiveRequests()), 2000).unref();
  }
});

/** A message as JSON; a record's times carry bigint seconds, which JSON.stringify refuses. */
function show(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
}

/** A root agent with a child process's Agent (joined with its own credential, session running) and the child's attenuated grant. */
async function family(name: string) {
  const root = await server.rootAgent(name);
  const spawned = await root.agent.spawn(`${name}-child`);
  const child = await Agent.join(server.baseUrl, spawned.credential);
  const stopChild = new AbortController();
  const childSession = child.run({ signal: stopChild.signal, heartbeatMs: 500 }).catch(() => {});
  await child.opened;
  const grant: Grant = await root.agent.delegate(root.grant.grant.grantId, child.nodeId, ["tool:search"], 600_000);
  const close = async () => {
    stopChild.abort();
    root.stopSession.abort();
    await Promise.all([childSession, root.session]);
    child.close();
  };
  cleanups.push(close);
  return { root, child, grant, close };
}

describe("ToolGate", () => {
  test("a draining subtree refuses new gated calls, and the record shows the refusal", async () => {
    const gate = await server.gate("search-gate-drain");
    const f = await family("drainer");
    let ran = 0;
    const search = gate.wrap("search", f.grant.token, async () => {
      ran++;
      return "result";
    });
    assert.equal(await search(), "result", "a call before the drain completes");

    const held = await TestServer.hold(gate, f.grant.token, "search");
    const terminationId = await server.terminate(f.root.agent.nodeId, "drain");
    // The child hears the drain on its session (an event, not a sleep).
    await new Promise<void>((resolve) => {
      if (f.child.drainSignal.aborted) return resolve();
      f.child.drainSignal.addEventListener("abort", () => resolve(), { once: true });
    });
    assert.ok(f.child.drainSignal.reason instanceof StopSignalled);
    assert.equal(f.child.signal.aborted, false, "a drain is not an abort");

    await assert.rejects(search(), (err: unknown) => {
      assert.ok(isRefusedStopping(err), `want failed_precondition, got ${String(err)}`);
      return true;
    });
    assert.equal(ran, 1, "the refused call's function never ran");
    held.release();
    await held.done; // the call in flight when the drain began finishes
    // New children are refused too.
    await assert.rejects(f.child.spawn("late"), (err: unknown) => err instanceof ConnectError);

    await f.child.confirmExit("drained");
    await f.root.agent.confirmExit("drained");
    const record = await server.record(terminationId);
    const resolutions = record.toolCalls.filter((c) => c.nodeId === f.child.nodeId).map((c) => c.resolution);
    assert.deepEqual(resolutions.sort(), [CallResolution.COMPLETED, CallResolution.REJECTED_DRAINING], "the held call completed, the new one was refused");
    await f.close();
    await gate.close();
  });

  test("an abort cancels an in-flight call: the tool observes its AbortSignal, the ack follows its return, the record shows it", async () => {
    const gate = await server.gate("search-gate-abort");
    const f = await family("aborter");
    let started!: () => void;
    const running = new Promise<void>((resolve) => (started = resolve));
    let observed: unknown;
    const call = gate.call(f.grant.token, "search", async (signal) => {
      started();
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      observed = signal.reason;
      throw signal.reason; // it stops
    });
    await running;
    const terminationId = await server.terminate(f.root.agent.nodeId, "abort");
    await assert.rejects(call, (err: unknown) => err instanceof ToolCallCancelled);
    assert.ok(observed instanceof ToolCallCancelled, "the tool saw the cancellation as its signal's reason");
    const callId = (observed as ToolCallCancelled).callId;

    const record = await server.record(terminationId);
    const entry = record.toolCalls.find((c) => c.callId === callId);
    assert.equal(entry?.resolution, CallResolution.CANCELLED_ACKED, `record entry: ${show(entry)}`);
    assert.equal(entry?.gateId, "search-gate-abort");
    // The agent heard the abort on its session.
    assert.ok(f.child.signal.aborted && f.child.signal.reason instanceof StopSignalled);
    await f.close();
    await gate.close();
  });
  test("after a cancel order only a tool the cancel stopped is acknowledged: a result is recorded completed, its own error failed", async () => {
    // The same probe as the Go and Python gates' tests: a rogue tool would
    // like a call whose side effect happened recorded as cancelled.
    const recorded: ToolCall[] = [];
    const gate = await server.gate("search-gate-after-cancel", { onRecorded: (c) => recorded.push(c) });
    const f = await family("finisher");
    const ids = new Map<string, string>();
    const starts: Promise<void>[] = [];
    const run = (name: string, then: (signal: AbortSignal) => unknown) => {
      let started!: () => void;
      starts.push(new Promise<void>((resolve) => (started = resolve)));
      return gate.call(f.grant.token, "search", async (signal) => {
        started();
        await TestServer.aborted(signal);
        ids.set(name, (signal.reason as ToolCallCancelled).callId);
        return then(signal);
      });
    };
    const completed = run("completed", () => "written anyway");
    const failed = run("failed", () => {
      throw new Error("disk full");
    });
    const stopped = run("stopped", (signal) => {
      throw signal.reason;
    });
    const domAbort = run("aborterror", () => {
      throw new DOMException("The operation was aborted.", "AbortError");
    });
    await Promise.all(starts);
    const terminationId = await server.terminate(f.root.agent.nodeId, "abort");
    assert.equal(await completed, "written anyway", "a tool that returned its result after the order: its result");
    await assert.rejects(failed, (err: unknown) => err instanceof Error && err.message === "disk full");
    await assert.rejects(stopped, (err: unknown) => err instanceof ToolCallCancelled);
    await assert.rejects(domAbort, (err: unknown) => err instanceof ToolCallCancelled || (err instanceof Error && err.name === "AbortError"));

    const record = await server.record(terminationId);
    const want: [string, CallResolution][] = [
      ["completed", CallResolution.COMPLETED],
      ["failed", CallResolution.FAILED],
      ["stopped", CallResolution.CANCELLED_ACKED],
      ["aborterror", CallResolution.CANCELLED_ACKED],
    ];
    for (const [name, resolution] of want) {
      const entry = record.toolCalls.find((c) => c.callId === ids.get(name));
      assert.equal(entry?.resolution, resolution, `${name}: record entry ${show(entry)}`);
      assert.equal(entry?.acknowledgedBy !== "", resolution === CallResolution.CANCELLED_ACKED, `${name}: acknowledged by ${entry?.acknowledgedBy}`);
    }
    const failedEntry = recorded.find((c) => c.callId === ids.get("failed"));
    assert.match(failedEntry?.error ?? "", /disk full/, "the failed call's error reached the ledger");
    await f.close();
    await gate.close();
  });
  test("a caller that leaves during the begin leaves no call in flight, and its tool never runs", async () => {
    // The same probe as the Go gate's test: the caller's signal aborts once
    // the control plane has recorded the begin (the call is open in the
    // ledger), whether or not its answer has reached the gate yet.
    const f = await family("leaver");
    const caller = new AbortController();
    const resp = await server.operator.auth.createToken({ toolServer: "search-gate-leaver", ttl: { seconds: 3600n } });
    const leaveOnceBegun: Interceptor = (next) => async (req) => {
      const answer = next(req);
      if (req.method.name === "BeginCall") {
        while ((await server.operator.tool.listCalls({ nodeId: f.child.nodeId })).calls.length === 0) {
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
        caller.abort(new Error("the caller left"));
      }
      return answer;
    };
    const sessions = new Http2SessionManager(server.baseUrl);
    cleanups.push(async () => sessions.abort());
    const conn = Conn.dial(server.baseUrl, resp.token, {
      transport: (bearer) => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", sessionManager: sessions, interceptors: [bearer, leaveOnceBegun] }),
    });
    const gate = new ToolGate(conn, "search-gate-leaver");
    await gate.ready;
    let ran = false;
    await assert.rejects(
      gate.call(f.grant.token, "search", () => {
        ran = true;
        return "ran";
      }, { signal: caller.signal }),
      /the caller left/,
    );
    assert.equal(ran, false, "the tool ran for a caller that had left");
    const open = await server.operator.tool.listCalls({ nodeId: f.child.nodeId });
    assert.equal(open.calls.length, 0, "a call is left in flight that nobody will end");
    await f.close();
    await gate.close();
  });

  test("a call its caller's signal stopped is acknowledged if the cancel was ordered, and failed otherwise", async () => {
    // The same probe as the Go gate's test. An agent's run aborted on its
    // own abort signal can stop a tool before the gate hears the order; the
    // call stopped after the order existed, and the abort waits for its
    // acknowledgement. This gate never hears its orders (its cancel stream
    // is held up), so only the caller's signal stops the tools. Before, the
    // gate reported the ordered call failed (the Python gate acknowledged it).
    const f = await family("caller-stopped");
    const recorded: ToolCall[] = [];
    const resp = await server.operator.auth.createToken({ toolServer: "search-gate-deaf", ttl: { seconds: 3600n } });
    const deaf: Interceptor = (next) => async (req) => {
      if (req.method.name === "WatchCancels") {
        await TestServer.aborted(req.signal);
        throw new ConnectError("held up", Code.Canceled);
      }
      return next(req);
    };
    const sessions = new Http2SessionManager(server.baseUrl);
    cleanups.push(async () => sessions.abort());
    const conn = Conn.dial(server.baseUrl, resp.token, {
      transport: (bearer) => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", sessionManager: sessions, interceptors: [bearer, deaf] }),
    });
    const gate = new ToolGate(conn, "search-gate-deaf", { onRecorded: (c) => recorded.push(c) });
    const run = async () => {
      const caller = new AbortController();
      let started!: () => void;
      const running = new Promise<void>((resolve) => (started = resolve));
      const call = gate.call(f.grant.token, "search", async (signal) => {
        started();
        await TestServer.aborted(signal);
        throw signal.reason;
      }, { signal: caller.signal });
      call.catch(() => {});
      await running;
      return { call, leave: () => caller.abort(new Error("the run was aborted")) };
    };
    const openCalls = async () => (await server.operator.tool.listCalls({ nodeId: f.child.nodeId })).calls;

    // No order: failed, with the caller's reason.
    const unordered = await run();
    unordered.leave();
    await assert.rejects(unordered.call, /the run was aborted/);
    assert.equal(recorded.length, 1);
    assert.equal(recorded[0].resolution, CallResolution.FAILED, `recorded ${show(recorded[0])}`);
    assert.match(recorded[0].error, /the run was aborted/);
    assert.equal(recorded[0].acknowledgedBy, "");

    // Ordered: the abort's order exists when the caller's signal aborts.
    const ordered = await run();
    const terminationId = await server.terminate(f.root.agent.nodeId, "abort");
    for (;;) {
      const calls = await openCalls();
      if (calls.length === 1 && calls[0].state === CallState.CANCEL_REQUESTED) break;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    ordered.leave();
    await assert.rejects(ordered.call, /the run was aborted/);
    const record = await server.record(terminationId);
    assert.deepEqual(
      record.toolCalls.map((c) => [c.resolution, c.acknowledgedBy]),
      [[CallResolution.CANCELLED_ACKED, "tool:search-gate-deaf"]],
      "the call stopped after the order is acknowledged",
    );
    await f.close();
    await gate.close();
  });

  test("a tool error echoing a hostile input (huge, with a lone surrogate) still ends the call in the ledger", async () => {
    // The same probe as the Go and Python gates' tests: the error goes out
    // clipped and as UTF-8, so EndCall is recorded and the caller gets the
    // tool's own error.
    const recorded: ToolCall[] = [];
    const gate = await server.gate("search-gate-hostile-error", { onRecorded: (c) => recorded.push(c) });
    const f = await family("hostile-error");
    const toolError = new Error("no such file: bad\udcff" + "é".repeat(1 << 20));
    await assert.rejects(
      gate.call(f.grant.token, "search", () => {
        throw toolError;
      }),
      (err: unknown) => err === toolError,
    );
    assert.equal(recorded.length, 1, "the call's end was recorded");
    assert.equal(recorded[0].resolution, CallResolution.FAILED);
    assert.ok(recorded[0].error.startsWith("no such file: bad\ufffd"), `recorded error: ${recorded[0].error.slice(0, 40)}`);
    const open = await server.operator.tool.listCalls({ nodeId: f.child.nodeId });
    assert.equal(open.calls.length, 0, "no call of the node is left open");
    await f.close();
    await gate.close();
  });
});

describe("Verifier", () => {
  test("a revoked grant fails verification once the feed delivers its tombstone; an ancestor's revocation covers the child", async () => {
    const f = await family("verified");
    const verifier = new Verifier({ conn: server.operator });
    const stop = new AbortController();
    const running = verifier.run(stop.signal);
    await verifier.ready;
    const claims = await verifier.authorize(f.grant.token, "tool:search");
    assert.equal(claims.holderNodeId, f.child.nodeId);
    assert.deepEqual(claims.chain, [f.root.grant.grant.grantId]);
    await assert.rejects(verifier.authorize(f.grant.token, "tool:shell"), (e: unknown) => e instanceof TokenError && e.kind === "scope_not_granted");

    // Revoke the root grant: the child's token must fail, via its ancestor.
    const revoked = await server.operator.capability.revoke({ target: { case: "grantId", value: f.root.grant.grant.grantId }, reason: "test" });
    await verifier.caughtUp(revoked.sequence);
    await assert.rejects(verifier.verify(f.grant.token), (e: unknown) => {
      assert.ok(e instanceof TokenError && e.kind === "grant_revoked", String(e));
      assert.match(e.message, /via ancestor grant/);
      assert.ok(!e.message.includes(f.grant.token), "the error never carries the token");
      return true;
    });
    stop.abort();
    await running;
    await f.close();
  });

  test("fails closed before the feed is heard and once it is stale", async () => {
    const f = await family("stale");
    let now = Date.now();
    const verifier = new Verifier({ conn: server.operator, stalenessBudgetMs: 10_000, clock: { now: () => now } });
    await assert.rejects(verifier.verify(f.grant.token), (e: unknown) => e instanceof TokenError && e.kind === "feed_stale");
    const stop = new AbortController();
    const running = verifier.run(stop.signal);
    await verifier.ready;
    await verifier.verify(f.grant.token);
    now += 10_001; // the verifier's clock passes the budget with no feed message applied since
    await assert.rejects(verifier.verify(f.grant.token), (e: unknown) => e instanceof TokenError && e.kind === "feed_stale");
    stop.abort();
    await running;
    await f.close();
  });

  test("refuses forged, re-signed and foreign tokens", async () => {
    const f = await family("forged");
    const verifier = new Verifier({ conn: server.operator, jwksMinIntervalMs: 60_000 });
    const stop = new AbortController();
    const running = verifier.run(stop.signal);
    await verifier.ready;
    const [h, p, s] = f.grant.token.split(".");
    const kind = async (token: string) => {
      try {
        await verifier.verify(token);
        return "accepted";
      } catch (e) {
        return e instanceof TokenError ? e.kind : String(e);
      }
    };
    const flipped = s.slice(0, 10) + (s[10] === "A" ? "B" : "A") + s.slice(11);
    assert.equal(await kind(`${h}.${p}.${flipped}`), "token_signature");
    const none = Buffer.from(JSON.stringify({ alg: "none", kid: "x" })).toString("base64url");
    assert.equal(await kind(`${none}.${p}.`), "token_algorithm");
    const hs = Buffer.from(JSON.stringify({ alg: "HS256", kid: "x" })).toString("base64url");
    assert.equal(await kind(`${hs}.${p}.${s}`), "token_algorithm");
    const scopes = JSON.parse(Buffer.from(p, "base64url").toString());
    scopes.scopes = ["tool:*"];
    assert.equal(await kind(`${h}.${Buffer.from(JSON.stringify(scopes)).toString("base64url")}.${s}`), "token_signature");
    assert.equal(await kind(`${h}.${p}.${s}\n`), "token_malformed");
    // An agent credential is not a capability token (another audience).
    assert.equal(await kind(f.child.credential), "token_audience");
    stop.abort();
    await running;
    await f.close();
  });
});

describe("LeaseWorker", () => {
  test("acks, renews, reports progress; a cancel request aborts the job's signal and is acknowledged", async () => {
    const f = await family("leased");
    const offered = await server.operator.lease.offer({ jobId: "ts-job-1", holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const worker = new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 });
    let cancelSeen = false;
    const job = await worker.accept(offered.lease!, { onCancel: () => void (cancelSeen = true) });
    await job.renew();
    await job.progress("half");
    assert.equal(job.lease.progressValue, "half");
    await server.operator.lease.requestCancel({ jobId: "ts-job-1", reason: "test" });
    await job.renew();
    assert.ok(job.signal.aborted);
    assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "cancelled");
    assert.ok(cancelSeen);
    const got = await server.operator.lease.getLease({ jobId: "ts-job-1" });
    assert.equal(got.lease?.cancelAck, true, "the worker acknowledged the cancel request");
    await job.complete(TerminalResult.CANCELLED, "stopped on request");
    await f.close();
  });

  test("a reassigned job's old generation learns it lost the lease", async () => {
    const f = await family("superseded");
    const offered = await server.operator.lease.offer({ jobId: "ts-job-2", holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const worker = new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 });
    const job = await worker.accept(offered.lease!);
    await server.operator.lease.reassign({ jobId: "ts-job-2", holderIdentity: f.root.agent.nodeId, leaseDuration: { seconds: 30n }, reason: "test" });
    await job.renew().catch(() => {});
    assert.ok(job.signal.aborted, "the old generation's signal fired");
    assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "lost", String(job.signal.reason));
    job.stop();
    await f.close();
  });

  test("a job that lost its lease never speaks for the next generation", async () => {
    // Reassigned to the same worker (generation 2) and accepted again: the
    // old job's headers and late success still speak for generation 1.
    const f = await family("zombie");
    const offered = await server.operator.lease.offer({ jobId: "ts-job-3", holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const worker = new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 });
    const old = await worker.accept(offered.lease!);
    const gen2 = await server.operator.lease.reassign({ jobId: "ts-job-3", holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n }, reason: "restart" });
    await old.renew();
    assert.ok(old.signal.aborted, "the old generation's signal fired");
    const current = await worker.accept(gen2.lease!);
    assert.deepEqual(old.headers(), { "Tether-Job-Id": "ts-job-3", "Tether-Lease-Generation": "1" });
    const zombie = await old.complete(TerminalResult.SUCCESS, "zombie");
    assert.equal(zombie?.auditEvent, AuditEvent.STALE_GENERATION);
    const got = await server.operator.lease.getLease({ jobId: "ts-job-3" });
    assert.equal(got.lease?.terminalResult, TerminalResult.UNSPECIFIED);
    assert.deepEqual(current.headers(), { "Tether-Job-Id": "ts-job-3", "Tether-Lease-Generation": "2" });
    await current.complete(TerminalResult.SUCCESS, "done");
    await f.close();
  });
});

describe("Agent", () => {
  test("a capability token is refreshed before it expires", async () => {
    const f = await family("refresher");
    let now = Date.now();
    const token = f.root.agent.capabilityToken(f.root.grant, { now: () => now });
    assert.equal(await token.get(), f.root.grant.token, "fresh: no refresh");
    now = f.root.grant.expiresAt.getTime() - 1000; // less than a third of its life left
    const fresh = await token.get();
    // Within the same second the control plane may mint the identical
    // token (whole-second times, deterministic Ed25519): the refresh shows
    // as a new grant answer.
    assert.notStrictEqual(token.grant, f.root.grant, "the token was refreshed");
    assert.equal(fresh, token.grant.token);
    await f.close();
  });

  test("join refuses an operator token", async () => {
    await assert.rejects(Agent.join(server.baseUrl, server.adminToken), /agent credential/);
  });

  test("an unauthenticated call is a clear Connect error", async () => {
    const conn = server.dial("not-a-token");
    await assert.rejects(conn.auth.whoAmI({}), (e: unknown) => e instanceof ConnectError && e.code === Code.Unauthenticated);
  });

  test("a token a header cannot carry is refused without quoting it", async () => {
    // A CRLF with a header of its own, or a space: nothing is sent, and the
    // error never quotes the token (Headers' own TypeError quoted the whole
    // value). The same probe as the Python SDK's; Go's refuses without the
    // value too.
    for (const bad of [`${server.adminToken}\r\nX-Evil: 1`, `${server.adminToken.slice(0, 20)} ${server.adminToken.slice(20)}`, `${server.adminToken}\n`]) {
      const conn = server.dial(bad);
      for (const call of [() => conn.auth.whoAmI({}), async () => { for await (const _ of conn.capability.watchRevocations({})) break; }]) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof ConnectError && e.code === Code.Unauthenticated, `got ${String(e).slice(0, 80)}`);
          assert.ok(!e.message.includes(server.adminToken.slice(0, 40)), "the error quotes the token");
          return true;
        });
      }
      conn.close();
    }
  });
});
