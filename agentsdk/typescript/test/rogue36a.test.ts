// The thirty-sixth hostile pass on the agent SDKs' side of a stop, the
// TypeScript SDK's part, through a real tether server: a signal callback
// that waits must not keep the agent from hearing the abort that escalates
// its drain, and an exit claimed from onDrain must be stored. (The Go SDK
// ran its callbacks on the session's reading goroutine and failed both; the
// TypeScript SDK does not await a callback's promise.)
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { StopSignalled, type Signal } from "../src/index.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue36a: a signal callback that waits", () => {
  test("an abort reaches an agent whose drain callback waits", async () => {
    const { agent } = await server.rootAgent("rogue36a-waiting-drain");
    let inDrain!: (s: Signal) => void;
    const drained = new Promise<Signal>((resolve) => (inDrain = resolve));
    let onAbort!: (s: Signal) => void;
    const aborted = new Promise<Signal>((resolve) => (onAbort = resolve));
    agent.onDrain(async (s) => {
      inDrain(s);
      await TestServer.aborted(agent.signal); // "finish what is in flight": the work stops on abort
    });
    agent.onAbort(onAbort);
    await server.terminate(agent.nodeId, "drain", 3600);
    assert.equal((await within(drained, 20_000, "the drain reaching onDrain")).abort, false);
    await server.terminate(agent.nodeId, "abort");
    await within(TestServer.aborted(agent.signal), 20_000, "the abort while onDrain waits");
    assert.ok(agent.signal.reason instanceof StopSignalled);
    assert.equal((await within(aborted, 20_000, "onAbort")).abort, true);
  });

  test("an exit claimed from onDrain is stored", async () => {
    const { agent } = await server.rootAgent("rogue36a-exit-in-drain");
    let claimed!: (c: { exit: Promise<void> }) => void;
    const claim = new Promise<{ exit: Promise<void> }>((resolve) => (claimed = resolve));
    agent.onDrain(() => claimed({ exit: agent.confirmExit("drained, nothing in flight") }));
    await server.terminate(agent.nodeId, "drain", 3600);
    const { exit } = await within(claim, 20_000, "the drain reaching onDrain");
    await within(exit, 20_000, "the exit claim");
    const got = await server.operator.agent.getNode({ nodeId: agent.nodeId });
    assert.ok(got.node?.exitedAt, "the node's exit claim was not stored");
  });

  // A child spawned just before its parent's stop joins into it: its
  // session's first word is the signal, which can arrive before the agent
  // registers its callbacks (once opened, say). onDrain and onAbort
  // registered after their signal never ran, and the agent never drained;
  // the Python SDK runs them at once.
  test("callbacks registered after their signal run", async () => {
    const { agent } = await server.rootAgent("rogue36a-late-callbacks");
    await server.terminate(agent.nodeId, "abort");
    await within(TestServer.aborted(agent.signal), 20_000, "the abort");
    const told: Record<string, Signal> = {};
    agent.onDrain((s) => (told.drain = s));
    agent.onAbort((s) => (told.abort = s));
    assert.equal(told.drain?.abort, true, "onDrain registered after the abort never ran");
    assert.equal(told.abort?.abort, true, "onAbort registered after the abort never ran");
  });
});
