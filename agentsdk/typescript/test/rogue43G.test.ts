// The forty-third hostile pass on the TypeScript SDK (letter G), through a
// real tether server: a ToolGate runs no tool whose cancel the control plane
// ordered before the tool began.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { StopSignalled, TetherScope, ToolCallCancelled, ToolGate } from "../src/index.js";
import { CallResolution, type ToolCall, type WatchCancelsResponse } from "../src/gen/tether/v1/tool_pb.js";
import { until } from "./peer.js";
import { dialThrough } from "./roguepath.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue43G: a tool whose cancel came before it ran does not run", () => {
  // The agent being stopped has its call begun (BeginCall recorded) just as
  // its abort is ordered: the control plane writes the cancel order of the
  // call it recorded, and the gate hears it before BeginCall's answer (a
  // round trip the agent's own path, or a loaded control plane, stretches).
  // The gate held the order (an early order) and cancelled the call the
  // moment it registered it, but then ran the tool function all the same,
  // with an aborted signal: a tool that does its side effect before it
  // looks at its signal (a write, a payment, a shell command: most tools
  // never look) did it after its stop, and the record read the call
  // completed by the agent the stop was about. Now the gate runs no
  // function whose cancel is already ordered: it acknowledges the cancel
  // and rejects with ToolCallCancelled, the tool never called.
  test("an early cancel order stops the call before its function runs", async () => {
    const { agent, grant } = await server.rootAgent("rogue43g");
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue43g", ttl: { seconds: 3600n } });
    // The gate's own path to the control plane holds BeginCall's answer
    // until the abort was ordered and the gate holds the call's cancel
    // order (what a slow answer does, made certain).
    let gate!: ToolGate;
    let terminationId = "";
    const slowBegin: Interceptor = (next) => async (req) => {
      const res = await next(req);
      if (req.method.name === "BeginCall") {
        terminationId = await server.terminate(agent.nodeId, "abort");
        // A guard against a hang, not a timing.
        await within(until(() => gate.heldOrders === 1), 20_000, "the gate holding the call's cancel order");
      }
      return res;
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, minted.token, slowBegin);
    const recorded: ToolCall[] = [];
    gate = new ToolGate(conn, "gate-rogue43g", { onRecorded: (c) => recorded.push(c) });
    try {
      await gate.ready;
      let ran = 0;
      const call = gate.call(grant.token, "write", () => {
        ran++; // the side effect: done before any look at the signal
        return "written";
      });
      const outcome: unknown = await call.then((v) => `resolved ${v}`, (err: unknown) => err);
      assert.notEqual(terminationId, "");
      assert.equal(
        ran,
        0,
        `the tool ran ${ran} time(s) after its cancel was ordered (the call ${String(outcome)}, recorded ${recorded.map((c) => CallResolution[c.resolution]).join(", ")})`,
      );
      assert.ok(outcome instanceof ToolCallCancelled, `the call ${String(outcome)}`);
      assert.equal(gate.heldOrders, 0);
      assert.equal(recorded.length, 1, `the gate reported ${recorded.length} ends of the call`);
      assert.equal(recorded[0]!.resolution, CallResolution.CANCELLED_ACKED, `the call recorded ${CallResolution[recorded[0]!.resolution]}`);
    } finally {
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});

describe("rogue43G: a scope's tool stops on its agent's abort", () => {
  // A TetherScope's call (every tool of the @openai/agents and
  // @langchain/langgraph adapters) ran its tool with the gate's signal
  // alone: the control plane's cancel order, heard on the gate's own
  // stream. A path that withholds that stream's orders (a proxy stalling
  // it, a hostile peer: the gate's watch open and silent) had the tool run
  // on after its agent heard its abort over its honest session, to its end,
  // its side effect done after the stop and the abort waiting out its
  // acknowledgement window; the Go SDK's Call under the agent's Context
  // and the Python adapters' run cancelled on the abort stop such a tool.
  // Now the scope passes its signal (the node's abort, or an ancestor's in
  // the run) as the call's: the tool stops on whichever is heard first, and
  // the gate acknowledges the order the control plane wrote.
  test("a gate deaf to its cancel orders still stops the tool on the agent's abort", async () => {
    const { agent, grant } = await server.rootAgent("rogue43g-scope");
    const minted = await server.operator.auth.createToken({ toolServer: "gate-rogue43g-deaf", ttl: { seconds: 3600n } });
    // The gate's path relays WatchCancels' headers, then nothing, until
    // the test lets it go (then the gate reconnects honestly).
    const deaf = new AbortController();
    const withholding: Interceptor = (next) => async (req) => {
      if (req.method.name !== "WatchCancels" || deaf.signal.aborted) return next(req);
      const res = await next(req);
      if (!res.stream) return res;
      const signal = AbortSignal.any([req.signal, deaf.signal]);
      const messages = async function* (): AsyncGenerator<WatchCancelsResponse> {
        if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        throw new ConnectError("the path held the gate's cancel orders (rogue43G)", Code.Unavailable);
      };
      return { ...res, message: messages() } as typeof res;
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, minted.token, withholding);
    const recorded: ToolCall[] = [];
    const gate = new ToolGate(conn, "gate-rogue43g-deaf", { onRecorded: (c) => recorded.push(c) });
    const scope = new TetherScope(agent, gate, agent.capabilityToken(grant));
    try {
      await gate.ready;
      let begun!: () => void;
      const running = new Promise<void>((resolve) => (begun = resolve));
      // A long tool that stops when its signal says so.
      const call = scope.call("write", (signal) => {
        begun();
        return new Promise<string>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
      });
      await running;
      await server.terminate(agent.nodeId, "abort");
      await within(TestServer.aborted(agent.signal), 20_000, "the agent hearing its abort");
      // A guard against the hang, not a timing.
      const outcome: unknown = await within(
        call.then((v) => `resolved ${v}`, (err: unknown) => err),
        20_000,
        () => `the tool still runs 20 s after its agent heard its abort (the gate deaf to its cancel orders; ${recorded.length} end(s) recorded)`,
      );
      assert.ok(outcome instanceof StopSignalled, `the call ${String(outcome)}`);
      assert.equal(recorded.length, 1, `the gate reported ${recorded.length} ends of the call`);
      assert.equal(recorded[0]!.resolution, CallResolution.CANCELLED_ACKED, `the call recorded ${CallResolution[recorded[0]!.resolution]}`);
    } finally {
      deaf.abort();
      await gate.close();
      conn.close();
      closeSessions();
    }
  });
});

