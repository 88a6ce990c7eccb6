// The forty-first hostile pass on the TypeScript SDK (letter F), through a
// real tether server: the Go SDK's Run waits a refused session's retry
// hint before it reconnects (rogue33b); the TypeScript run reconnected on
// its own backoff alone.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { Agent, retryHintMs } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  // A lineage's budget of half a request a second, bursts of one: its
  // refusal's hint is up to two seconds, past the reconnection's first
  // backoffs (100 ms, 200 ms, ...).
  server = await startServer("--rate-limit", "0.5");
});
after(async () => {
  await server?.stop();
});

// A parent hands its child the credential spawn gave it, and keeps a
// copy. A rogue parent (or any member of the child's lineage, for the
// budget) spends, as its child, the lineage's budget and the child's own
// upkeep reserve (heartbeats, which are paid from the one and then the
// other): the honest child's session is refused resource_exhausted with
// the lineage's retry hint. The TypeScript run reconnected after 100 ms,
// 200 ms, 400 ms..., each attempt refused (and its heartbeat in its
// place) until the budget refilled, where the Go SDK's Run waits the
// hint. run now waits the hint (stretched as a unary retry's, through the
// connection's RetryOptions.wait, which this test records) before it
// reconnects.
test("rogue41F: run waits the retry hint of a session refused for its lineage's budget", async (t) => {
  const parent = await Agent.registerRoot(server.operator, "rogue41f-parent");
  const child = await parent.spawn("rogue41f-honest-child");

  // The honest child's connection's waits, once armed: run's before it
  // reconnects (the one asked for as run warns of it) are recorded, and a
  // unary call's retry is refused (its heartbeat in place of the session
  // is not retried, so that the rogue keeps the budgets spent). Before,
  // the join's calls wait for the lineage's budget (its spawn spent its
  // burst): the join retries until it is paid.
  const waits: number[] = [];
  let armed = false;
  let reconnecting = false;
  let waited!: () => void;
  const firstWait = new Promise<void>((resolve) => (waited = resolve));
  const stopRun = new AbortController();
  const recordingWait = (ms: number): Promise<void> => {
    if (!armed) return new Promise((resolve) => setTimeout(resolve, ms));
    if (!reconnecting) return Promise.reject(new Error("rogue41F: no unary retry once run runs"));
    waits.push(ms);
    waited();
    // One wait is all this test asks about: run ends here.
    stopRun.abort();
    return Promise.resolve();
  };
  const honest = await Agent.join(server.baseUrl, child.credential, { retry: { attempts: 8, jitter: () => 0, wait: recordingWait } });

  // The rogue, as its child, spends the lineage's budget and the child's
  // upkeep reserve with heartbeats, and keeps them spent while the honest
  // child runs.
  const rogue = server.dial(child.credential);
  let rogueHint: number | undefined;
  for (let i = 0; i < 256 && rogueHint === undefined; i++) {
    try {
      await rogue.agent.heartbeat({ nodeId: child.node.nodeId });
    } catch (err) {
      assert.equal(ConnectError.from(err).code, Code.ResourceExhausted, String(err));
      rogueHint = retryHintMs(err);
      assert.ok(rogueHint !== undefined, `the lineage's refusal has no hint: ${err}`);
    }
  }
  assert.ok(rogueHint !== undefined, "256 heartbeats never spent the lineage's budget and the node's reserve");
  // Two loops, so that a token the budgets regain is the rogue's before
  // the honest child's session can take it.
  let spending = true;
  const spend = async () => {
    while (spending) await rogue.agent.heartbeat({ nodeId: child.node.nodeId }).catch(() => {});
  };
  const spenders = [spend(), spend()];

  const warned: string[] = [];
  let reconnectedTwice!: () => void;
  const twice = new Promise<void>((resolve) => (reconnectedTwice = resolve));
  armed = true;
  const ran = honest
    .run({
      signal: stopRun.signal,
      heartbeatMs: 500,
      warn: (m) => {
        warned.push(m);
        if (warned.length >= 2) reconnectedTwice();
        // run waits, if by the connection's wait, as it warns: a wait
        // asked for later is a unary call's retry.
        reconnecting = true;
        queueMicrotask(() => (reconnecting = false));
      },
    })
    .catch((err: unknown) => err);
  try {
    // Whichever comes first: run's first wait by the policy, its second
    // reconnection without one, its session opened (the budget refilled,
    // the hint never waited), or run's end.
    let opened = false;
    await Promise.race([firstWait, twice, honest.opened.then(() => (opened = true)), ran]);
    assert.ok(
      waits.length > 0,
      `run reconnected without waiting the refused session's hint (${warned.length} reconnections, none by the connection's wait, session opened: ${opened}: ${JSON.stringify(warned)})`,
    );
    assert.match(warned[0] ?? "", /resource_exhausted/, "the honest child's session must be refused for its lineage's budget");
    // The refusal's hint is Retry-After's whole seconds: at least one.
    t.diagnostic(`run waited ${waits[0]} ms before reconnecting, after: ${warned[0]}`);
    assert.ok(waits[0] >= 1000, `run's wait before reconnecting: ${waits[0]} ms, want at least the refusal's hint (a second or more; the rogue's was ${rogueHint} ms)`);
  } finally {
    stopRun.abort();
    await ran;
    spending = false;
    await Promise.all(spenders);
    honest.conn.close();
    parent.conn.close();
  }
});
