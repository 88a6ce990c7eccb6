// The thirty-fifth hostile pass on the TypeScript SDK's verifier: with a
// clock injected, the feed's age was that clock's now minus the last
// message's arrival, and only a clock that went back past the message
// failed closed: a step back short of it (a feed dead for 8 s, the clock
// set back 5 s) took the step off the age, and a feed dead for 13 s of the
// clock's own ticking read 8 s old, so a rogue's revoked token, whose
// revocation the dead feed never carried, passed. The age now adds up the
// clock's forward steps only.
import assert from "node:assert/strict";
import { test } from "node:test";
import { inspect } from "node:util";

import { Agent, Conn, TokenError, Verifier } from "../src/index.js";
import { feedHooks } from "../src/internal.js";
import { until } from "./peer.js";
import { startServer, type TestServer } from "./server.js";

const stale = (e: unknown) => e instanceof TokenError && e.kind === "feed_stale";

test("rogue35f: a clock set back does not shorten the feed's age", async () => {
  let s: TestServer | undefined = await startServer();
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  const conn = Conn.dial(s.baseUrl, s.adminToken, { retry: { attempts: 1 } });
  try {
    let now = Date.now();
    let interrupted = 0;
    const warn = (m: string) => {
      if (m.includes("revocation feed interrupted")) interrupted++;
    };
    const verifier = new Verifier({ conn, stalenessBudgetMs: 10_000, clock: { now: () => now }, warn });
    run = verifier.run(stop.signal);
    await verifier.ready;
    await s.stop(); // the feed dies: nothing more is heard
    s = undefined;
    await until(() => interrupted > 0); // its stream is over
    now += 8_000;
    verifier.checkFresh(); // 8 s, within the budget of 10
    now -= 5_000; // the clock set back
    verifier.checkFresh(); // still 8 s of the clock's ticking
    now += 5_000;
    assert.throws(() => verifier.checkFresh(), stale, "a feed dead for 13 s of the clock's ticking was fresh");
  } finally {
    stop.abort();
    await run;
    conn.close();
    await s?.stop();
  }
});

test("rogue35f: a live feed is fresh again after a step back", async () => {
  const s = await startServer();
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  const conn = Conn.dial(s.baseUrl, s.adminToken, { retry: { attempts: 1 } });
  try {
    let now = Date.now();
    const verifier = new Verifier({ conn, stalenessBudgetMs: 10_000, clock: { now: () => now } });
    run = verifier.run(stop.signal);
    await verifier.ready;
    now -= 3_600_000;
    await until(() => {
      try {
        verifier.checkFresh();
        return true;
      } catch {
        return false;
      }
    });
  } finally {
    stop.abort();
    await run;
    conn.close();
    await s.stop();
  }
});

// A key the verifier does not know yet signs the rogue's token (its first
// fetch of the key set failed), so the check fetches the key set, and the
// answer is slow. Meanwhile the rogue's grant is revoked and the feed
// stalls, unheard, and the budget passes. The check had looked at the
// feed's freshness before the fetch only, and accepted the revoked token
// once the key set came; it looks again where the tombstones are.
test("rogue35f: a slow key-set answer does not outlast the feed", async () => {
  const s = await startServer();
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  const conn = Conn.dial(s.baseUrl, s.adminToken, { retry: { attempts: 1 } });
  const realFetch = globalThis.fetch;
  let fetches = 0;
  let hold = false;
  let held = false;
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  globalThis.fetch = async (input, init) => {
    if (!String(input).endsWith("/.well-known/jwks.json")) return realFetch(input, init);
    if (++fetches === 1) throw new Error("the key set is not reachable yet");
    const resp = await realFetch(input, init);
    if (!hold) return resp;
    const body = await resp.arrayBuffer(); // the answer read whole, then held
    held = true;
    await released;
    return new Response(body, { status: resp.status, headers: resp.headers });
  };
  let stalled = false;
  let stuck = false;
  let unstall!: () => void;
  const unstalled = new Promise<void>((resolve) => (unstall = resolve));
  try {
    const rogue = await Agent.registerRoot(s.operator, "rogue");
    rogue.conn.close();
    const x = await s.operator.capability.issueRoot({ holderNodeId: rogue.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
    let now = Date.now();
    const verifier = new Verifier({ conn, stalenessBudgetMs: 10_000, clock: { now: () => now } });
    feedHooks.set(verifier, async () => {
      if (!stalled) return;
      stuck = true;
      await unstalled; // the feed heard nothing more
    });
    run = verifier.run(stop.signal);
    await verifier.ready;
    hold = true;
    const checked = verifier.verify(x.token).then(
      () => undefined,
      (e: unknown) => e,
    );
    await until(() => held); // the check waits for the key set's answer
    stalled = true;
    await until(() => stuck);
    await s.operator.capability.revoke({ target: { case: "grantId", value: x.grant!.grantId }, reason: "rogue" }); // unheard
    now += 10_001;
    release();
    const err = await checked;
    assert.ok(stale(err), `the rogue's revoked token across a slow key-set answer: ${err === undefined ? "accepted" : String(err)}`);
  } finally {
    globalThis.fetch = realFetch;
    release();
    unstall();
    stop.abort();
    await run;
    conn.close();
    await s.stop();
  }
});

// What a framework logs of the SDK's objects is read by whoever reads the
// logs, a rogue among them: console.log (util.inspect) of a spawned Child
// showed the credential its process joins with, and of a Grant its
// capability token. They now show neither (JSON.stringify, asked for on
// purpose, still carries them).
test("rogue35f: printed objects carry no secret", async () => {
  const s = await startServer();
  try {
    const parent = await Agent.registerRoot(s.operator, "parent");
    try {
      const child = await parent.spawn("child");
      const root = await s.operator.capability.issueRoot({ holderNodeId: parent.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
      const grant = await parent.refreshToken(root.grant!.grantId);
      const source = parent.capabilityToken(grant);
      const secrets: Record<string, string> = { "the child's credential": child.credential, "the grant's token": grant.token, "the agent's credential": parent.credential };
      for (const [what, obj] of Object.entries({ child, grant, source, parent, conn: parent.conn })) {
        for (const shown of [inspect(obj), inspect(obj, { showHidden: true, depth: 5 }), String(obj)]) {
          for (const [name, secret] of Object.entries(secrets)) {
            const sig = secret.slice(secret.lastIndexOf(".") + 1);
            assert.ok(!shown.includes(secret) && !shown.includes(sig), `the ${what} printed carries ${name}: ${shown.slice(0, 200)}`);
          }
        }
      }
      assert.deepEqual(Object.keys(child), ["node", "credential"]); // still what JSON.stringify carries
    } finally {
      parent.conn.close();
    }
  } finally {
    await s.stop();
  }
});
