// The twentieth hostile pass on the TypeScript SDK: the control plane as a
// peer that misbehaves (a real HTTP/2 server on loopback, test/peer.ts), and
// the promises the Go SDK's rogue tests pin, kept here too:
// - a control plane that never answers, or trickles its answer: a unary
//   call (Agent.join, spawn, confirmExit, a fence's GetLease) waited until
//   the connection broke, where the Python SDK's calls carry the
//   connection's 30 s;
// - cancel orders for made-up ids while a begin is always under way: the
//   gate held every one of them (the Go gate holds at most MaxEarlyOrders);
// - a key set of many megabytes: the verifier read all of it, for as long
//   as the peer sent, before it looked at its size (the Go verifier stops
//   reading at 1 MiB);
// - an ACK answered with another generation's lease: the job claimed the
//   generation the answer named, not the one it acknowledged, in its
//   renewals and fencing headers (the Go job claims the offered one, and
//   ends as superseded).
import assert from "node:assert/strict";
import { once } from "node:events";
import http from "node:http";
import type http2 from "node:http2";
import { after, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { Agent, Conn, JobEnded, LeaseWorker, MaxEarlyOrders, ToolCallCancelled, ToolGate, Verifier } from "../src/index.js";
import { AckResponseSchema, AuditEvent, LeaseSchema, LeaseState, Outcome } from "../src/gen/tether/v1/lease_pb.js";
import { WhoAmIResponseSchema } from "../src/gen/tether/v1/auth_pb.js";
import { BeginCallResponseSchema, CancelAckResponseSchema, EndCallResponseSchema, WatchCancelsResponseSchema } from "../src/gen/tether/v1/tool_pb.js";
import { Peer, respondStream, streamMessage, unary, until, type Handler } from "./peer.js";

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

async function codeOf(call: Promise<unknown>): Promise<Code | string> {
  return call.then(
    () => "answered",
    (e: unknown) => (e instanceof ConnectError ? e.code : String(e)),
  );
}

describe("rogue20: a control plane that never answers a unary call", () => {
  test("the call ends at the connection's timeout; streams carry none", async () => {
    const seen: Record<string, string | undefined> = {};
    const peer = await startPeer({
      WhoAmI: (stream, headers) => {
        seen.WhoAmI = headers["connect-timeout-ms"] as string | undefined;
        unary(stream, WhoAmIResponseSchema, { nodeId: "n-rogue20" });
      },
      WatchCancels: (stream, headers) => {
        seen.WatchCancels = headers["connect-timeout-ms"] as string | undefined;
        respondStream(stream); // held open
      },
      GetNode: () => {}, // accepted, never answered
    });
    // The default: every unary call carries a deadline, streams none.
    const conn = Conn.dial(peer.url, "rogue20-token");
    stops.push(() => conn.close());
    await conn.auth.whoAmI({});
    assert.equal(seen.WhoAmI, "30000", "a unary call's deadline by default");
    const gate = new ToolGate(conn, "ts-rogue20-gate");
    stops.push(() => void gate.close());
    await gate.ready;
    assert.equal(seen.WatchCancels, undefined, "a stream was given a deadline");

    // A join whose GetNode is never answered ends at its connection's
    // timeout, with the connection's code for it.
    const joined = Agent.join(peer.url, "rogue20-credential", { timeoutMs: 200 });
    assert.equal(await codeOf(joined), Code.DeadlineExceeded);
  });

  test("a call whose answer trickles ends at the timeout too", async () => {
    const peer = await startPeer({
      WhoAmI: (stream) => {
        stream.respond({ ":status": 200, "content-type": "application/proto" });
        stream.write(Buffer.from([0x0a])); // the first byte of an answer, and nothing after
      },
    });
    const conn = Conn.dial(peer.url, "rogue20-token", { timeoutMs: 200 });
    stops.push(() => conn.close());
    assert.equal(await codeOf(conn.auth.whoAmI({})), Code.DeadlineExceeded);
    // A call's own timeout is its own.
    assert.equal(await codeOf(conn.auth.whoAmI({}, { timeoutMs: 100 })), Code.DeadlineExceeded);
  });
});

describe("rogue20: cancel orders for made-up ids while a begin is under way", () => {
  test("the gate holds at most MaxEarlyOrders of them, and none once the begin settled", async () => {
    const flood = 5 * MaxEarlyOrders;
    let watch: http2.ServerHttp2Stream | undefined;
    const begins: http2.ServerHttp2Stream[] = [];
    const peer = await startPeer({
      WatchCancels: (stream) => {
        respondStream(stream);
        watch = stream; // held open: the orders to come
      },
      BeginCall: (stream) => {
        begins.push(stream);
        // The first begin is answered; the second waits for the test.
        if (begins.length === 1) unary(stream, BeginCallResponseSchema, { call: { callId: "call-a", tool: "shell" } });
      },
      CancelAck: (stream) => unary(stream, CancelAckResponseSchema, {}),
      EndCall: (stream) => unary(stream, EndCallResponseSchema, {}),
    });
    const conn = Conn.dial(peer.url, "rogue20-tool-token");
    stops.push(() => conn.close());
    const gate = new ToolGate(conn, "ts-rogue20-gate-flood");
    stops.push(() => void gate.close());
    await until(() => watch !== undefined);

    // Call a runs until its cancel order, which the peer sends after the
    // flood: once a stops, the gate has read every order of it.
    let running = false;
    const a = gate.call("a-capability-token", "shell", (signal) => {
      running = true;
      return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
    });
    await until(() => running);
    const b = gate.call("a-capability-token", "shell", () => "done");
    await until(() => begins.length === 2);
    const out: Buffer[] = [];
    for (let i = 0; i < flood; i++) out.push(streamMessage(WatchCancelsResponseSchema, { callId: `made-up-${i}`, reason: "flood" }));
    out.push(streamMessage(WatchCancelsResponseSchema, { callId: "call-a", reason: "termination t1 cancelled the call" }));
    watch!.write(Buffer.concat(out));
    await assert.rejects(a, ToolCallCancelled);
    assert.ok(gate.heldOrders <= MaxEarlyOrders, `the gate holds ${gate.heldOrders} orders for calls it has not registered`);

    unary(begins[1]!, BeginCallResponseSchema, { call: { callId: "call-b", tool: "shell" } });
    assert.equal(await b, "done");
    assert.equal(gate.heldOrders, 0);
  });
});

describe("rogue20: a key set of many megabytes", () => {
  test("is refused once it passes 1 MiB, not read to its end", async () => {
    let written = 0;
    const chunk = Buffer.alloc(64 << 10, 0x20);
    const jwks = http.createServer((req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write("{\"keys\":[");
      // 8 MiB of spaces, then the answer is held open: a reader that
      // waits for its end waits until its own timeout.
      const more = () => {
        while (written < 8 << 20) {
          written += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", more);
        }
      };
      more();
    });
    jwks.listen(0, "127.0.0.1");
    await once(jwks, "listening");
    stops.push(() => jwks.closeAllConnections());
    stops.push(() => jwks.close());
    const url = `http://127.0.0.1:${(jwks.address() as { port: number }).port}`;

    const conn = Conn.dial(url, "rogue20-token");
    stops.push(() => conn.close());
    const warnings: string[] = [];
    const stop = new AbortController();
    const verifier = new Verifier({ conn, warn: (m) => (warnings.push(m), stop.abort()) });
    await verifier.run(stop.signal);
    assert.match(warnings[0] ?? "", /key set larger than 1 MiB/);
  });
});

describe("rogue20: an ACK answered with another generation's lease", () => {
  test("the job claims the generation it acknowledged, and ends superseded", async () => {
    let renewals = 0;
    const peer = await startPeer({
      Ack: (stream) =>
        unary(stream, AckResponseSchema, {
          lease: { jobId: "ts-rogue20-ack", leaseId: "l2", leaseGeneration: 2n, state: LeaseState.ACTIVE, leaseDuration: { seconds: 300n } },
          decision: { outcome: Outcome.ACCEPTED, auditEvent: AuditEvent.ACKED },
        }),
      Renew: () => void renewals++, // never answered
    });
    const conn = Conn.dial(peer.url, "rogue20-agent-token");
    stops.push(() => conn.close());
    const worker = new LeaseWorker({ conn, renewEveryMs: 60_000 });
    const offered = create(LeaseSchema, { jobId: "ts-rogue20-ack", leaseId: "l1", leaseGeneration: 1n, state: LeaseState.OFFERED });
    const job = await worker.accept(offered);
    stops.push(() => job.stop());
    assert.deepEqual(job.headers(), { "Tether-Job-Id": "ts-rogue20-ack", "Tether-Lease-Generation": "1" });
    assert.ok(job.signal.aborted, "a job whose ACK's answer names a later generation goes on");
    assert.ok(job.signal.reason instanceof JobEnded && job.signal.reason.kind === "lost", String(job.signal.reason));
    assert.equal(renewals, 0);
  });
});
