// An exit claimed over a session that breaks as the claim goes out: the
// peer reads the session's messages and, on the exit, ends the session with
// an error without storing the claim (its replica went away, or it could
// not store it and said so); ConfirmExit it answers and keeps. confirmExit
// resolved once that session ended, however it ended: it said the claim
// was made, run() stopped (the agent had exited), and the record said
// nobody confirmed the honest agent's exit. Whether the claim counted
// depended on which came first, its arrival or the session's end. A clean
// end after the claim (the control plane's answer to a claim it stored)
// now counts; otherwise the claim is made by ConfirmExit.
import assert from "node:assert/strict";
import type http2 from "node:http2";
import { after, describe, test } from "node:test";

import { fromBinary } from "@bufbuild/protobuf";
import { Agent } from "../src/index.js";
import { ConfirmExitRequestSchema, ConfirmExitResponseSchema, GetNodeResponseSchema, SessionRequestSchema, SessionResponseSchema } from "../src/gen/tether/v1/agent_pb.js";
import { WhoAmIResponseSchema } from "../src/gen/tether/v1/auth_pb.js";
import { Peer, respondStream, streamEnd, streamMessage, unary, until } from "./peer.js";

const peers: Peer[] = [];
const stops: (() => void)[] = [];
after(async () => {
  stops.forEach((s) => s());
  for (const p of peers) await p.stop();
});

/** Calls fn with each whole message of a Connect stream's request as it arrives. */
function onMessages(stream: http2.ServerHttp2Stream, fn: (data: Uint8Array) => void): void {
  let buf = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const n = buf.readUInt32BE(1);
      if ((buf[0] & 2) === 0) fn(buf.subarray(5, 5 + n));
      buf = buf.subarray(5 + n);
    }
  });
}

async function exitPeer(broken: boolean, stored: string[]): Promise<Peer> {
  const peer = new Peer({
    WhoAmI: (stream) => unary(stream, WhoAmIResponseSchema, { nodeId: "n-flake27" }),
    GetNode: (stream) => unary(stream, GetNodeResponseSchema, { node: { nodeId: "n-flake27", name: "flake27" } }),
    Session: (stream) => {
      respondStream(stream);
      stream.write(streamMessage(SessionResponseSchema, { kind: { case: "opened", value: { node: { nodeId: "n-flake27" } } } }));
      onMessages(stream, (data) => {
        const msg = fromBinary(SessionRequestSchema, data);
        if (msg.kind.case !== "exit") return;
        if (broken) {
          stream.end(streamEnd({ code: "unavailable", message: "the replica went away before it stored the claim" }));
          return;
        }
        stored.push(`session: ${msg.kind.value.reason}`);
        stream.end(streamEnd());
      });
    },
    ConfirmExit: (stream) => {
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => {
        stored.push(`ConfirmExit: ${fromBinary(ConfirmExitRequestSchema, Buffer.concat(chunks)).reason}`);
        unary(stream, ConfirmExitResponseSchema, {});
      });
    },
  });
  await peer.start();
  peers.push(peer);
  return peer;
}

describe("flake27: an exit claimed over a session", () => {
  for (const [name, broken, want] of [
    ["that stores it and ends cleanly counts", false, "session: done"],
    ["that breaks as the claim goes out is claimed by ConfirmExit", true, "ConfirmExit: done"],
  ] as const) {
    test(name, async () => {
      const stored: string[] = [];
      const peer = await exitPeer(broken, stored);
      const agent = await Agent.join(peer.url, "flake27-credential");
      stops.push(() => agent.close());
      const stop = new AbortController();
      stops.push(() => stop.abort());
      let ran = false;
      const running = agent.run({ signal: stop.signal, heartbeatMs: 60_000 }).finally(() => (ran = true));
      await agent.opened;
      await agent.confirmExit("done");
      assert.deepEqual(stored, [want], "the claims stored once confirmExit resolved");
      await until(() => ran);
      await running;
    });
  }
});
