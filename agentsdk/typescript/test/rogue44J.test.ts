// The forty-fourth hostile pass, SDK parity (letter J), through a real
// tether server and a rogue path in front of it (an interceptor on the
// SDK's own HTTP/2 transport): a TypeScript tool gate whose WatchCancels
// stream's headers a path withholds is ready all the same, as the Go gate's
// Ready (closed once the stream is asked for), and hears its cancel orders
// once the path is honest again.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { ToolGate } from "../src/index.js";
import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import { type ToolCall } from "../src/gen/tether/v1/tool_pb.js";
import { callUntilCancelled, type CallUntilCancelled, dialThrough } from "./roguepath.js";
import { startServer, type TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue44J: a path that withholds the cancel stream's headers does not hold the gate", () => {
  // A hostile element on a tool server's path holds the gate's first
  // WatchCancels stream open and sends nothing back, not even its headers.
  // The TypeScript gate's `ready` resolved once a stream's headers arrived:
  // it never did, and a tool server that awaits `ready` before it serves
  // (as the SDK's examples do) was held for good, even once the path was
  // honest again (an idle gate keeps its stream: nothing refreshed it).
  // The Go gate's Ready closes once the stream is asked for; the
  // TypeScript gate's `ready` now resolves so too, and a call begun then
  // makes the gate busy, so the held stream is given up at the refresh
  // interval and the cancel order heard on the next.
  test("the first stream's headers withheld", async () => {
    const { agent, grant } = await server.rootAgent("rogue44j-gate");
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue44j", ttl: { seconds: 3600n } });
    let opened = 0;
    const withholding: Interceptor = (next) => async (req) => {
      if (req.method.name !== "WatchCancels") return next(req);
      if (++opened !== 1) return next(req);
      // Nothing back until the gate gives the stream up.
      const signal = req.signal;
      if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
      throw new ConnectError("the path withheld the gate's stream (rogue44J)", Code.Canceled);
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, minted.token, withholding);
    const recorded: ToolCall[] = [];
    // The refresh interval injected short: 400 of them fit in each guard.
    const gate = new ToolGate(conn, "gate-rogue44j", { onRecorded: (c) => recorded.push(c), cancelWatchRefreshMs: 50 });
    let held: CallUntilCancelled | undefined;
    try {
      // A guard against the hang, not a timing.
      await within(gate.ready, 20_000, () => `the gate is not ready 20 s (400 refresh intervals) after it was made: ${opened} WatchCancels stream(s) asked for, the first's headers withheld`);
      held = callUntilCancelled(gate, grant.token);
      await held.running;
      await server.operator.supervisor.terminate({
        nodeId: agent.nodeId,
        mode: TerminationMode.ABORT,
        cancelAckTimeout: { seconds: 3600n },
        reason: "rogue44J",
      });
      await held.cancelled(() => `the gate is deaf: its tool still running 20 s after its abort was ordered; ${opened} WatchCancels stream(s) asked for`, recorded);
      assert.ok(opened >= 2, `the order heard on ${opened} stream(s): the withheld one relayed it`);
    } finally {
      held?.release();
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});
