// The forty-fifth hostile pass on the MCP tether (letter F), the Go gate's
// fix (TestRogue45FGateRefusesABeginCallAnswerNamingAnotherCallInFlight)
// brought to TypeScript, through a real tether server: the gate's path to
// the control plane (a proxy that replays, caches or crosses answers)
// answers one call's BeginCall with the answer to another call the gate
// has in flight.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { ToolCallCancelled, ToolGate } from "../src/index.js";
import type { BeginCallResponse } from "../src/gen/tether/v1/tool_pb.js";
import { dialThrough } from "./roguepath.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/**
 * A gate's connection through a path that answers the second BeginCall it
 * relays with the answer to the first, whatever the control plane answered
 * the second; first() is that answer.
 */
function crossingPath(token: string): ReturnType<typeof dialThrough> & { first: () => BeginCallResponse | undefined } {
  let first: BeginCallResponse | undefined;
  let begins = 0;
  const crossing: Interceptor = (next) => async (req) => {
    if (req.method.name !== "BeginCall") return next(req);
    const n = ++begins;
    try {
      const res = await next(req);
      if (n === 1) first = res.message as BeginCallResponse;
      if (n === 2 && first) return { ...res, message: first } as typeof res;
      return res;
    } catch (err) {
      if (n === 2 && first) return { message: first, header: new Headers(), trailer: new Headers(), stream: false } as never;
      throw err;
    }
  };
  return { ...dialThrough(server.baseUrl, token, crossing), first: () => first };
}

describe("rogue45F: a gate takes no BeginCall answer naming another call it has in flight", () => {
  // The gate took any call id it was answered: the second call ran under
  // the first's id, its registration replaced the first's cancel and its
  // end removed it, and its EndCall recorded the first call completed while
  // the first's tool still ran, deaf to its cancel. Now the second call is
  // refused (internal), its tool not run, and the first stays in flight
  // and hears its cancel.
  test("a crossed BeginCall answer does not run the tool under another call's id", async () => {
    const { agent, grant } = await server.rootAgent("rogue45f");
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue45f", ttl: { seconds: 3600n } });
    const { conn, closeSessions, first } = crossingPath(minted.token);
    const gate = new ToolGate(conn, "gate-rogue45f");
    // Ends B's tool when the test ends however it ends (close waits for it).
    const release = new AbortController();
    try {
      await gate.ready;
      // Call B: its tool runs until its signal ends it.
      let begun!: () => void;
      const running = new Promise<void>((resolve) => (begun = resolve));
      const callB = gate.call(grant.token, "write", (signal) => {
        begun();
        return new Promise<string>((_, reject) => {
          signal.addEventListener("abort", () => reject(signal.reason), { once: true });
          release.signal.addEventListener("abort", () => reject(new Error("released by the test")), { once: true });
        });
      });
      const outcomeB = callB.then((v) => `resolved ${v}`, (err: unknown) => err);
      await running;

      // Call A: the path answers its BeginCall with B's answer.
      let ranA = 0;
      const outcomeA: unknown = await gate
        .call(grant.token, "write", () => {
          ranA++; // the side effect
          return "written";
        })
        .then((v) => `resolved ${v}`, (err: unknown) => err);
      assert.equal(ranA, 0, `call A answered with call B's begin: its tool ran ${ranA} time(s), the call ${String(outcomeA)}`);
      assert.ok(outcomeA instanceof ConnectError && outcomeA.code === Code.Internal, `call A ${String(outcomeA)}, want internal`);

      // The ledger: B still in flight while its tool runs, and A's own call.
      const bId = first()!.call!.callId;
      const open = await server.operator.tool.listCalls({ nodeId: agent.nodeId });
      assert.ok(
        open.calls.some((c) => c.callId === bId) && open.calls.length === 2,
        `call B (${bId}) not in flight: open calls ${open.calls.map((c) => c.callId).join(", ")}`,
      );

      // The abort: B's tool hears its cancel and the gate acknowledges it.
      await server.terminate(agent.nodeId, "abort");
      // A guard against a hang, not a timing.
      const b = await within(outcomeB, 20_000, "call B's tool never heard its cancel");
      assert.ok(b instanceof ToolCallCancelled, `call B ${String(b)}`);
    } finally {
      release.abort();
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});

describe("rogue45F: a gate takes no BeginCall answer of another tool", () => {
  // The path answers a call of the tool "read" with the answer to an
  // earlier call of "write" (ended: no call the gate has in flight). The
  // gate ran "read" under the "write" call's id: a call's answer names its
  // tool, and one naming another is not this call's.
  test("an answer naming another tool does not run the function", async () => {
    const { grant } = await server.rootAgent("rogue45f-tool", ["tool:write"]);
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue45f-tool", ttl: { seconds: 3600n } });
    const { conn, closeSessions } = crossingPath(minted.token);
    const gate = new ToolGate(conn, "gate-rogue45f-tool");
    try {
      await gate.ready;
      assert.equal(await gate.call(grant.token, "write", () => "written"), "written");
      let ran = 0;
      const outcome: unknown = await gate
        .call(grant.token, "read", () => {
          ran++; // the side effect
          return "read";
        })
        .then((v) => `resolved ${v}`, (err: unknown) => err);
      assert.equal(ran, 0, `a call of read answered with a call of write: its function ran ${ran} time(s), the call ${String(outcome)}`);
      assert.ok(outcome instanceof ConnectError && outcome.code === Code.Internal, `the call ${String(outcome)}, want internal`);
    } finally {
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});
