// The eighteenth hostile pass on the TypeScript SDK: the control plane as a
// peer that misbehaves. The peer is a real HTTP/2 (h2c) server on loopback
// speaking the Connect protocol, standing where the control plane would,
// that answers what the test needs and holds, breaks or floods the rest:
// - a coordinator that never answers a renewal: the LeaseWorker renewed on
//   every tick regardless, each renewal waiting for ever, so the requests
//   (and their memory) piled up without bound; the Go worker gives each
//   renewal its interval and renews one at a time;
// - sessions that fail, then one that opens and breaks: Agent.run kept the
//   longest wait it had reached, so an agent whose session broke once after
//   a bad minute reconnected seconds late every time after;
// - cancel orders for calls the gate never began (a previous process's, or
//   made-up ids): the gate kept every one of them, for ever;
// - an answer of 17 MiB, or one that inflates to it: a Conn read any size
//   the peer sent (connect's default is 4 GiB), where the Python SDK stops
//   at 16 MiB.
import assert from "node:assert/strict";
import type http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { after, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import { Agent, Conn, LeaseWorker, ToolCallCancelled, ToolGate } from "../src/index.js";
import { GetNodeResponseSchema, NodeSchema, SessionResponseSchema } from "../src/gen/tether/v1/agent_pb.js";
import { WhoAmIResponseSchema } from "../src/gen/tether/v1/auth_pb.js";
import { AckResponseSchema, LeaseSchema, LeaseState, Outcome } from "../src/gen/tether/v1/lease_pb.js";
import { BeginCallResponseSchema, CancelAckResponseSchema, WatchCancelsResponseSchema } from "../src/gen/tether/v1/tool_pb.js";
import { Peer, respondStream, streamEnd, streamMessage, unary, until, type Handler } from "./peer.js";

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

describe("rogue18: a coordinator that never answers a renewal", () => {
  test("the worker renews one at a time, and gives up on each after its interval", async () => {
    const renewals: http2.ServerHttp2Stream[] = [];
    let overlapped = 0;
    const peer = await startPeer({
      Ack: (stream) =>
        unary(stream, AckResponseSchema, {
          lease: { jobId: "ts-rogue18-hung", leaseId: "l1", leaseGeneration: 1n, state: LeaseState.ACTIVE, leaseDuration: { seconds: 300n } },
          decision: { outcome: Outcome.ACCEPTED },
        }),
      // Accepted and never answered: the stream stays open until the
      // worker gives up on it.
      Renew: (stream) => {
        overlapped += renewals.filter((s) => !s.closed).length;
        renewals.push(stream);
      },
    });
    const conn = Conn.dial(peer.url, "rogue18-agent-token");
    stops.push(() => conn.close());
    const warnings: string[] = [];
    const worker = new LeaseWorker({ conn, renewEveryMs: 20, warn: (m) => warnings.push(m) });
    const offered = create(LeaseSchema, { jobId: "ts-rogue18-hung", leaseId: "l1", leaseGeneration: 1n, state: LeaseState.OFFERED });
    const job = await worker.accept(offered);
    stops.push(() => job.stop());

    await until(() => renewals.length >= 4);
    job.stop();
    assert.equal(overlapped, 0, `a renewal was sent while ${overlapped} earlier one(s) still waited for their answer`);
    assert.ok(renewals.slice(0, 3).every((s) => s.closed), "a renewal nobody answered was never given up");
    assert.ok(warnings.length >= 3, `each renewal that ran out is told: ${JSON.stringify(warnings)}`);
    assert.ok(warnings.every((w) => !w.includes("rogue18-agent-token")), "the token is in a warning");
  });
});

describe("rogue18: sessions that fail, then one that opens and breaks", () => {
  test("the wait before a reconnect starts again once a session opened", async () => {
    let sessions = 0;
    const peer = await startPeer({
      WhoAmI: (stream) => unary(stream, WhoAmIResponseSchema, { nodeId: "n-rogue18" }),
      GetNode: (stream) => unary(stream, GetNodeResponseSchema, { node: create(NodeSchema, { nodeId: "n-rogue18", name: "rogue18" }) }),
      Session: (stream) => {
        sessions++;
        respondStream(stream);
        // Three sessions refused, the fourth opened and then broken, the
        // rest held open.
        if (sessions <= 3) {
          stream.end(streamEnd({ code: "unavailable", message: "the peer refuses the session" }));
        } else if (sessions === 4) {
          stream.write(streamMessage(SessionResponseSchema, { kind: { case: "opened", value: { node: { nodeId: "n-rogue18", name: "rogue18" } } } }));
          stream.end(streamEnd({ code: "unavailable", message: "the peer broke the session" }));
        }
      },
    });
    const agent = await Agent.join(peer.url, "rogue18-credential");
    stops.push(() => agent.close());
    const waits: number[] = [];
    const stop = new AbortController();
    const ran = agent.run({
      signal: stop.signal,
      warn: (m) => {
        const ms = /reconnecting in (\d+) ms/.exec(m);
        if (ms) waits.push(Number(ms[1]));
        if (waits.length === 4) stop.abort();
      },
    });
    await ran;
    assert.deepEqual(waits, [100, 200, 400, 100], "the wait after a session that opened");
  });
});

describe("rogue18: a run stopped while it waits to reconnect", () => {
  test("ends, and opens no session on the aborted signal", async () => {
    let sessions = 0;
    const peer = await startPeer({
      WhoAmI: (stream) => unary(stream, WhoAmIResponseSchema, { nodeId: "n-rogue18-stop" }),
      GetNode: (stream) => unary(stream, GetNodeResponseSchema, { node: create(NodeSchema, { nodeId: "n-rogue18-stop" }) }),
      Session: (stream) => {
        sessions++;
        respondStream(stream);
        if (sessions === 1) stream.end(streamEnd({ code: "unavailable", message: "the peer refuses the session" }));
        // later ones are held open, as a session that opened would be
      },
    });
    const agent = await Agent.join(peer.url, "rogue18-credential");
    stops.push(() => agent.close());
    const stop = new AbortController();
    let settled = false;
    const ran = agent.run({ signal: stop.signal, warn: () => stop.abort() }).finally(() => (settled = true));
    await until(() => settled || sessions > 1);
    assert.equal(sessions, 1, "a session was opened after the run's signal aborted");
    await ran;
  });
});

describe("rogue18: cancel orders for calls the gate never began", () => {
  test("are not kept; an order that comes before its call's begin answer still cancels it", async () => {
    const flood = 5000;
    let watches = 0;
    let watch: http2.ServerHttp2Stream | undefined;
    let begin: http2.ServerHttp2Stream | undefined;
    const peer = await startPeer({
      WatchCancels: (stream) => {
        watches++;
        respondStream(stream);
        if (watches === 1) {
          // A flood of orders for ids this gate never began, then the end.
          const out: Buffer[] = [];
          for (let i = 0; i < flood; i++) out.push(streamMessage(WatchCancelsResponseSchema, { callId: `made-up-${i}`, reason: "flood" }));
          stream.write(Buffer.concat(out));
          stream.end(streamEnd());
        } else {
          watch = stream; // held open: the orders to come
        }
      },
      BeginCall: (stream) => {
        begin = stream;
      },
      CancelAck: (stream) => unary(stream, CancelAckResponseSchema, {}),
    });
    const conn = Conn.dial(peer.url, "rogue18-tool-token");
    stops.push(() => conn.close());
    const gate = new ToolGate(conn, "ts-rogue18-gate");
    stops.push(() => void gate.close());

    // The gate has read the whole flood once it reconnected.
    await until(() => watch !== undefined);
    assert.equal(gate.heldOrders, 0, `the gate keeps ${gate.heldOrders} orders for calls it never began`);

    // A real early order: it comes while this gate's begin waits for its
    // answer, and the answer names its call.
    let aborted: unknown;
    const call = gate.call("a-capability-token", "shell", (signal) => {
      return new Promise((_, reject) => {
        const stop = () => {
          aborted = signal.reason;
          reject(signal.reason);
        };
        if (signal.aborted) stop();
        else signal.addEventListener("abort", stop, { once: true });
      });
    });
    await until(() => begin !== undefined);
    watch!.write(streamMessage(WatchCancelsResponseSchema, { callId: "call-early", reason: "termination t1 cancelled the call" }));
    await until(() => gate.heldOrders === 1);
    unary(begin!, BeginCallResponseSchema, { call: { callId: "call-early", tool: "shell" } });
    await assert.rejects(call, ToolCallCancelled);
    // The early order cancelled its call before the tool ran: the function
    // is not called at all (rogue43G).
    assert.equal(aborted, undefined, "the tool ran after its early cancel order");
    assert.equal(gate.heldOrders, 0);
  });
});

describe("rogue18: an answer larger than any the control plane sends", () => {
  test("is refused for its size, as it comes or once it inflates", async () => {
    const huge = create(WhoAmIResponseSchema, { nodeId: "n".repeat(17 << 20) });
    const bytes = Buffer.from(toBinary(WhoAmIResponseSchema, huge));
    let asked = 0;
    const peer = await startPeer({
      WhoAmI: (stream) => {
        asked++;
        if (asked === 1) {
          stream.respond({ ":status": 200, "content-type": "application/proto" });
          stream.end(bytes);
        } else {
          stream.respond({ ":status": 200, "content-type": "application/proto", "content-encoding": "gzip" });
          stream.end(gzipSync(bytes));
        }
      },
    });
    const conn = Conn.dial(peer.url, "rogue18-token");
    stops.push(() => conn.close());
    for (const how of ["as it comes", "once it inflates"]) {
      const err = await conn.auth.whoAmI({}).then(
        () => new Error(`an answer of 17 MiB was read ${how}`),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ConnectError, String(err));
      assert.equal(err.code, Code.ResourceExhausted, `${how}: ${err.message}`);
    }
    assert.equal(asked, 2);
  });
});

describe("rogue18: a begin answered without its call", () => {
  test("is refused in the control plane's words, the tool not run", async () => {
    const peer = await startPeer({
      WatchCancels: (stream) => respondStream(stream), // held open
      BeginCall: (stream) => unary(stream, BeginCallResponseSchema, {}),
    });
    const conn = Conn.dial(peer.url, "rogue18-tool-token");
    stops.push(() => conn.close());
    const gate = new ToolGate(conn, "ts-rogue18-gate-empty");
    stops.push(() => void gate.close());
    let ran = false;
    const err = await gate.call("a-capability-token", "shell", () => (ran = true)).then(
      () => new Error("the call went on"),
      (e: unknown) => e,
    );
    assert.equal(ran, false);
    assert.ok(err instanceof ConnectError, String(err));
    assert.equal(err.code, Code.Internal);
    assert.match(err.message, /without a call/);
    assert.equal(gate.heldOrders, 0);
  });
});
