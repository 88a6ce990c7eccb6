// The fortieth hostile pass on the TypeScript SDK (letter G), through a real
// tether server: the parity of two of the thirty-ninth pass's Go fixes.
//
// - run, ending on a dead credential, settled at once, while the onAbort
//   callbacks the abort signal had started (the agent's cleanup: its
//   subprocesses, its leases) still ran: an agent whose process ends when
//   run does was cut off in the middle of its cleanup. And a callback
//   registered after its signal ran unguarded.
// - a gated tool whose failure the gate could not put into words (a value
//   that has no text, an error whose message is not text: what a tool that
//   rethrows its input, or an upstream's answer to it, throws) left its call
//   in flight in the ledger for good: the gate threw on describing it and
//   never reported the end.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, type Signal } from "../src/index.js";
import { CallState } from "../src/gen/tether/v1/tool_pb.js";
import { abortWaitHooks } from "../src/internal.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** Resolves once every microtask queued so far (and those they queue) has run. */
function microtasksDrained(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

describe("rogue40G: run and the onAbort callbacks", () => {
  // A rogue parent (here the operator, as one) aborts the agent: the abort
  // reaches it over its session first, which starts its onAbort callbacks;
  // the refusal that ends its session (the launcher's attestation) comes
  // after. run settled at once (resolved: the agent had been told):
  // `await agent.run(); process.exit()` ended the agent in the middle of
  // its cleanup.
  test("run returns a dead credential's refusal once the onAbort callbacks the session started have settled", async () => {
    const agent = await Agent.registerRoot(server.operator, "rogue40G-abort-cleanup");
    let started!: (s: Signal) => void;
    const cleaning = new Promise<Signal>((resolve) => (started = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const cleaned: string[] = [];
    agent.onAbort(async (s) => {
      started(s);
      await released; // the cleanup, under way until the test lets it end
      cleaned.push("registered before");
    });
    let refused!: () => void;
    const waiting = new Promise<void>((resolve) => (refused = resolve));
    abortWaitHooks.set(agent, refused);
    const ctl = new AbortController();
    const warned: string[] = [];
    let settled: { err: unknown; cleaned: string[] } | undefined;
    const ran = agent.run({ signal: ctl.signal, heartbeatMs: 250, warn: (m) => warned.push(m) }).then(
      () => (settled = { err: undefined, cleaned: [...cleaned] }),
      (err: unknown) => (settled = { err, cleaned: [...cleaned] }),
    );
    try {
      await within(agent.opened, 20_000, "the session opening");
      await server.terminate(agent.nodeId, "abort");
      assert.equal((await within(cleaning, 20_000, "onAbort on the abort signal")).abort, true);
      // Registered after the abort: it runs at once, and run waits for it too.
      agent.onAbort(async () => {
        await released;
        cleaned.push("registered after");
      });
      // The launcher's attestation ends the stop: the node is terminated
      // and its credential refused, which ends the session.
      await server.operator.agent.confirmExit({ nodeId: agent.nodeId, reason: "rogue40G: the process ended" });
      await within(waiting, 30_000, "run hearing its session refused");
      await microtasksDrained();
      assert.equal(settled, undefined, `run settled (${String(settled?.err)}) while the onAbort callbacks were still cleaning up`);
      release();
      await within(ran, 20_000, "run's end once the callbacks settled");
      const got = settled as { err: unknown; cleaned: string[] } | undefined;
      assert.deepEqual(got?.cleaned.sort(), ["registered after", "registered before"], "run settled before its onAbort callbacks had");
      assert.ok(agent.signal.aborted);
    } finally {
      release();
      ctl.abort();
      await ran;
      agent.close();
    }
  });

  // One registered after its signal ran unguarded: its promise's rejection
  // was an unhandled rejection, which ends a Node process by default (the
  // thirty-eighth pass guarded only those the signal itself runs).
  test("an onAbort registered after the abort that rejects is reported, not an unhandled rejection", async () => {
    const agent = await Agent.registerRoot(server.operator, "rogue40G-late-rejecting-abort");
    const warned: string[] = [];
    const ctl = new AbortController();
    const ran = agent.run({ signal: ctl.signal, heartbeatMs: 500, warn: (m) => warned.push(m) }).catch(() => {});
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    const others = process.listeners("unhandledRejection");
    process.removeAllListeners("unhandledRejection");
    process.on("unhandledRejection", onUnhandled);
    try {
      await within(agent.opened, 20_000, "the session opening");
      await server.terminate(agent.nodeId, "abort");
      await within(TestServer.aborted(agent.signal), 20_000, "the abort");
      agent.onAbort(async () => {
        await Promise.resolve();
        throw new Error("rogue40G: a late abort callback gone wrong");
      });
      agent.onDrain(async () => {
        await Promise.resolve();
        throw new Error("rogue40G: a late drain callback gone wrong");
      });
      await within(
        (async () => {
          while (warned.filter((m) => m.includes("late") && m.includes("gone wrong")).length < 2 && unhandled.length < 2) {
            await new Promise((resolve) => setImmediate(resolve));
          }
        })(),
        20_000,
        "the rejections' report",
      );
      assert.deepEqual(unhandled, [], "a late callback's rejection was left unhandled (it ends a Node process by default)");
    } finally {
      process.off("unhandledRejection", onUnhandled);
      for (const l of others) process.on("unhandledRejection", l as (...a: unknown[]) => void);
      ctl.abort();
      await ran;
      agent.close();
    }
  });
});

describe("rogue40G: a gated tool whose failure has no text", () => {
  // A tool that rethrows what its input (or an upstream's answer to it)
  // says went wrong, as it came: a rogue agent's JSON input decides the
  // value thrown. The gate described the failure for the ledger with
  // String() or the message's replaceAll, threw on it, and never reported
  // the call's end: the call stayed in flight for good, the agent's drain
  // waited for it to its deadline and the abort then recorded the gate's
  // cancel unacknowledged (the tool server blamed for a call that had
  // ended).
  const inputs: [string, string, (input: string) => never][] = [
    [
      "a thrown value with no text",
      '{"toString": 1, "detail": "rogue input"}',
      (input) => {
        throw JSON.parse(input);
      },
    ],
    [
      "an error whose message is not text",
      '{"message": {"detail": "rogue input"}}',
      (input) => {
        throw Object.assign(new Error("the upstream refused"), JSON.parse(input));
      },
    ],
  ];
  for (const [what, input, tool] of inputs) {
    test(`a tool that fails with ${what} is recorded failed`, async () => {
      const gate = await server.gate(`rogue40G-gate-${what.replaceAll(" ", "-")}`);
      const { agent, grant } = await server.rootAgent(`rogue40G-${what.replaceAll(" ", "-")}`);
      let thrown: unknown;
      let rejected: unknown;
      await gate
        .call(grant.token, "shell", () => {
          try {
            tool(input);
          } catch (err) {
            thrown = err;
            throw err;
          }
        })
        .then(
          () => assert.fail("the failing tool's call resolved"),
          (err: unknown) => (rejected = err),
        );
      const open = await server.operator.tool.listCalls({ nodeId: agent.nodeId });
      assert.deepEqual(
        open.calls.map((c) => `${c.callId}: ${CallState[c.state]}`),
        [],
        "the ledger holds the call open after its tool failed: nobody will end it",
      );
      assert.equal(rejected, thrown, "the gate's caller did not get the tool's own failure");
    });
  }
});
