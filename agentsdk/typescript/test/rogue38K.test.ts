// The thirty-eighth hostile pass on the TypeScript SDK's signal callbacks,
// through a real tether server. The SDK ran onDrain's and onAbort's
// callbacks in turn on the session's reading, unguarded: one that threw
// (a library's, say, that registered beside the agent's own) skipped every
// callback after it, for good (the signal was noted, the list emptied), and
// when the first signal was an abort, agent.signal did not abort until the
// session had broken on the throw and reconnected (after its backoff, if
// the control plane took it back at all). One whose promise rejected was
// an unhandled rejection, which ends a Node process by default: the agent
// died mid-drain, its exit never claimed. The Go and Python SDKs run the
// callbacks apart from the session's reading; Python logs a failure and
// runs the next.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, StopSignalled, type Signal } from "../src/index.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** A root agent whose session runs with warnings kept in warned. */
async function agentWithWarnings(name: string): Promise<{ agent: Agent; warned: string[]; stop: () => Promise<void> }> {
  const agent = await Agent.registerRoot(server.operator, name);
  const warned: string[] = [];
  const ctl = new AbortController();
  const session = agent.run({ signal: ctl.signal, heartbeatMs: 500, warn: (m) => warned.push(m) }).catch(() => {});
  await agent.opened;
  return {
    agent,
    warned,
    stop: async () => {
      ctl.abort();
      await session;
      agent.close();
    },
  };
}

describe("rogue38K: a signal callback that fails", () => {
  test("a drain callback that throws skips no other callback and does not hold back the abort", async () => {
    const { agent, warned, stop } = await agentWithWarnings("rogue38K-throwing-drain");
    try {
      let abortSeenInDrain: boolean | undefined;
      const told: Record<string, Signal> = {};
      let abortedCalled!: () => void;
      const abortCalled = new Promise<void>((resolve) => (abortedCalled = resolve));
      agent.onDrain(() => {
        throw new Error("rogue38K: a library's drain callback gone wrong");
      });
      agent.onDrain((s) => {
        told.drain = s;
        abortSeenInDrain = agent.signal.aborted;
      });
      agent.onAbort((s) => {
        told.abort = s;
        abortedCalled();
      });
      await server.terminate(agent.nodeId, "abort");
      await within(TestServer.aborted(agent.signal), 20_000, "the abort");
      await within(abortCalled, 20_000, "onAbort");
      assert.ok(agent.signal.reason instanceof StopSignalled);
      assert.equal(told.drain?.abort, true, "the drain callback registered after the one that threw never ran");
      assert.equal(told.abort?.abort, true);
      // The abort was noted with the drain, before any callback ran: the
      // agent's work stopped whatever its callbacks did.
      assert.equal(abortSeenInDrain, true, "agent.signal had not aborted when the drain callbacks ran");
      assert.ok(
        warned.some((m) => m.includes("onDrain callback") && m.includes("gone wrong")),
        `the failure was not reported to warn: ${JSON.stringify(warned)}`,
      );
    } finally {
      await stop();
    }
  });

  test("an async drain callback that rejects is reported, not an unhandled rejection", async () => {
    const { agent, warned, stop } = await agentWithWarnings("rogue38K-rejecting-drain");
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    // The test runner's own listener would fail the file on it: count it
    // here instead, for the assertion below.
    const others = process.listeners("unhandledRejection");
    process.removeAllListeners("unhandledRejection");
    process.on("unhandledRejection", onUnhandled);
    try {
      let after!: () => void;
      const afterRan = new Promise<void>((resolve) => (after = resolve));
      agent.onDrain(async () => {
        await Promise.resolve();
        throw new Error("rogue38K: an async drain callback gone wrong");
      });
      agent.onDrain(() => after());
      await server.terminate(agent.nodeId, "drain", 3600);
      await within(afterRan, 20_000, "the drain callbacks");
      await within(
        (async () => {
          while (!warned.some((m) => m.includes("async drain callback gone wrong")) && unhandled.length === 0) {
            await new Promise((resolve) => setImmediate(resolve));
          }
        })(),
        20_000,
        "the rejection's report",
      );
      assert.deepEqual(unhandled, [], "the callback's rejection was left unhandled (it ends a Node process by default)");
    } finally {
      process.off("unhandledRejection", onUnhandled);
      for (const l of others) process.on("unhandledRejection", l as (...a: unknown[]) => void);
      await stop();
    }
  });
});
