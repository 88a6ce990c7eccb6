// The twenty-first hostile pass on the TypeScript SDK's ToolGate, as the Go
// and Python SDKs' (rogue21 tests there too): a hostile control plane (a
// peer on loopback, test/peer.ts) flooding a gate's cancel orders, while a
// begin is under way, with call ids of 64 KiB had up to MaxEarlyOrders of
// them held, whatever their size.
import assert from "node:assert/strict";
import type http2 from "node:http2";
import { after, describe, test } from "node:test";

import { Conn, ToolCallCancelled, ToolGate } from "../src/index.js";
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

describe("rogue21: cancel orders for call ids of 64 KiB while a begin is under way", () => {
  test("the gate holds none of them", async () => {
    let watch: http2.ServerHttp2Stream | undefined;
    const begins: http2.ServerHttp2Stream[] = [];
    const peer = await startPeer({
      WatchCancels: (stream) => {
        respondStream(stream);
        watch = stream;
      },
      BeginCall: (stream) => {
        begins.push(stream);
        if (begins.length === 1) unary(stream, BeginCallResponseSchema, { call: { callId: "c-ts-rogue21-a", tool: "shell" } });
      },
      CancelAck: (stream) => unary(stream, CancelAckResponseSchema, {}),
      EndCall: (stream) => unary(stream, EndCallResponseSchema, {}),
    });
    const conn = Conn.dial(peer.url, "rogue21-tool-token");
    stops.push(() => conn.close());
    const gate = new ToolGate(conn, "ts-rogue21-gate");
    stops.push(() => void gate.close());
    await until(() => watch !== undefined);
    let running = false;
    const a = gate.call("a-capability-token", "shell", (signal) => {
      running = true;
      return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
    });
    await until(() => running);
    const b = gate.call("a-capability-token", "shell", () => "done");
    await until(() => begins.length === 2);
    const out: Buffer[] = [];
    for (let i = 0; i < 64; i++) out.push(streamMessage(WatchCancelsResponseSchema, { callId: `c-${i}-${"x".repeat(64 << 10)}`, reason: "flood" }));
    out.push(streamMessage(WatchCancelsResponseSchema, { callId: "c-ts-rogue21-a", reason: "termination t1 cancelled the call" }));
    watch!.write(Buffer.concat(out));
    await assert.rejects(a, ToolCallCancelled);
    assert.equal(gate.heldOrders, 0, `the gate holds ${gate.heldOrders} orders for call ids of 64 KiB`);
    unary(begins[1]!, BeginCallResponseSchema, { call: { callId: "c-ts-rogue21-b", tool: "shell" } });
    assert.equal(await b, "done");
  });
});
