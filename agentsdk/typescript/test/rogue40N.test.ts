// The fortieth hostile pass on the TypeScript SDK (letter N), through a
// real tether server: the Go SDK's Run heard, this pass, the signal of a
// child whose sessions its rogue parent holds (rogue40a); the TypeScript
// run heard signals over its session alone.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import type { SessionResponse } from "../src/gen/tether/v1/agent_pb.js";
import { Agent } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

// tree.MaxOpenSessions: the sessions a node may hold open.
const maxOpenSessions = 8;

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

// A parent hands its child the credential spawn gave it, and keeps a
// copy. A rogue parent opens, as its child, every session a node may hold
// open and reads none of them: the honest child's own session is refused
// resource_exhausted at each reconnection, and its run, which heard
// signals over its session alone, never heard its stop: the operator's
// drain of the rogue's subtree went to the rogue's sessions, and the child
// worked on, its drainSignal live, until its credential was refused at the
// record. run now asks, as each refused session ends, the unary Heartbeat,
// whose answer carries the node's signal (and a fresh credential).
test("rogue40N: a child whose sessions its parent holds hears its stop", async () => {
  const { agent: parent } = await server.rootAgent("rogue40n-parent");
  const child = await parent.spawn("rogue40n-honest-child");

  // The rogue's sessions as its child: each opened, then never read.
  const asChild = server.dial(child.credential);
  const hold = new AbortController();
  let released!: () => void;
  const release = new Promise<void>((resolve) => (released = resolve));
  async function* hello() {
    yield { kind: { case: "hello" as const, value: { nodeId: child.node.nodeId } } };
    await release;
  }
  for (let i = 0; i < maxOpenSessions; i++) {
    const held = (asChild.agent.session(hello(), { signal: hold.signal }) as AsyncIterable<SessionResponse>)[Symbol.asyncIterator]();
    const first = await held.next();
    assert.equal(first.done, false, `the rogue's session ${i} as its child ended`);
    assert.equal(first.value.kind.case, "opened", `the rogue's session ${i} as its child did not open`);
  }

  const honest = await Agent.join(server.baseUrl, child.credential, { retry: { attempts: 1 } });
  const stopRun = new AbortController();
  let refused!: (message: string) => void;
  const firstRefusal = new Promise<string>((resolve) => (refused = resolve));
  const ran = honest.run({ signal: stopRun.signal, heartbeatMs: 500, warn: (m) => refused(m) }).catch(() => {});
  try {
    // The honest child's own session is refused for the bound.
    const warned = await firstRefusal;
    assert.match(warned, /resource_exhausted/, "the honest child's session must be refused for the rogue's sessions");

    // The operator drains the rogue's subtree, with an hour to drain and
    // an hour for the exit: the record, which refuses the child's
    // credential, is an hour away.
    await server.operator.supervisor.terminate({
      nodeId: parent.nodeId,
      mode: TerminationMode.DRAIN,
      drainWindow: { seconds: 3600n },
      confirmTimeout: { seconds: 3600n },
      reason: "rogue40n",
    });
    // A guard against the hang (the failure this test is about), not a
    // timing: the refused child heartbeats within a reconnection's backoff
    // (at most 5 s).
    const heard = await honest.waitForStop(20_000);
    assert.ok(heard, "the honest child, its sessions held by its rogue parent, never heard the drain of its subtree");
    assert.equal(honest.signal.aborted, false, "a drain, not an abort, was signalled");
  } finally {
    stopRun.abort();
    await ran;
    honest.conn.close();
    released();
    hold.abort();
  }
});
