// The thirty-fourth hostile pass on the TypeScript SDK's verifier: a
// snapshot answer spans several feed messages when the control plane
// holds more live tombstones than one message carries (a thousand), and
// the verifier replaced its tombstone set with the first: until the last
// arrived, a token whose revocation the copy sent later was accepted. It
// now keeps its old set (adding the copy's tombstones to it) until the
// snapshot's last message, which says it does not continue.
import assert from "node:assert/strict";
import { cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Agent, Conn, TokenError, Verifier } from "../src/index.js";
import { feedHooks } from "../src/internal.js";
import { startServer, type TestServer } from "./server.js";

const maxFeedBatch = 1000;

/** n root grants issued to a fresh node of s, revoked in one revocation (n tombstones). */
async function revokeMany(s: TestServer, name: string, n: number): Promise<void> {
  const node = await Agent.registerRoot(s.operator, name);
  node.conn.close();
  for (let i = 0; i < n; i += 50) {
    await Promise.all(
      Array.from({ length: Math.min(50, n - i) }, () => s.operator.capability.issueRoot({ holderNodeId: node.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } })),
    );
  }
  const res = await s.operator.capability.revoke({ target: { case: "holderNodeId", value: node.nodeId }, reason: "filler" });
  assert.equal(res.revokedGrantIds.length, n);
}

test("rogue34f: a snapshot in several messages keeps the old set until its last", async () => {
  const flags = ["--grant-max-per-node", "1100"];
  let s = await startServer(...flags);
  const backup = join(mkdtempSync(join(tmpdir(), "tether-ts-backup-")), "data");
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  let conn: Conn | undefined;
  try {
    await revokeMany(s, "filler", maxFeedBatch);
    const rogue = await Agent.registerRoot(s.operator, "rogue");
    rogue.conn.close();
    const x = await s.operator.capability.issueRoot({ holderNodeId: rogue.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
    await s.operator.capability.revoke({ target: { case: "grantId", value: x.grant!.grantId }, reason: "rogue" });
    s = await s.restartInPlace(() => cpSync(s.dataDir, backup, { recursive: true }), undefined, ...flags);
    const later = await s.operator.capability.issueRoot({ holderNodeId: rogue.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
    const revoked = await s.operator.capability.revoke({ target: { case: "grantId", value: later.grant!.grantId }, reason: "later" });

    conn = Conn.dial(s.baseUrl, s.adminToken);
    const verifier = new Verifier({ conn, stalenessBudgetMs: 60_000 });
    run = verifier.run(stop.signal);
    await verifier.caughtUp(revoked.sequence);
    await assert.rejects(verifier.verify(x.token), (e: unknown) => e instanceof TokenError && e.kind === "grant_revoked");

    let restored = false;
    const seen: { snapshot: boolean; continues: boolean; tombstones: number; accepted: boolean }[] = [];
    feedHooks.set(verifier, async (msg) => {
      if (!restored) return;
      let accepted = true;
      try {
        await verifier.verify(x.token);
      } catch (e) {
        accepted = !(e instanceof TokenError && e.kind === "grant_revoked");
      }
      seen.push({ snapshot: msg.snapshot, continues: msg.continues, tombstones: msg.tombstones.length, accepted });
    });
    // The store restored from the copy taken before the later revocation:
    // the verifier's position is past its head, and it answers with a
    // snapshot of its 1,001 live tombstones.
    s = await s.restartInPlace(
      () => {
        restored = true;
      },
      backup,
      ...flags,
    );
    while (verifier.head !== revoked.sequence - 1n) await new Promise((r) => setTimeout(r, 20));

    assert.ok(seen.length >= 2 && seen[0].snapshot && seen[0].tombstones === maxFeedBatch, `the restored server's answer: ${JSON.stringify(seen)}`);
    assert.deepEqual(
      seen.filter((m) => m.accepted),
      [],
      `the verifier accepted the rogue's revoked token between the snapshot's messages: ${JSON.stringify(seen)}`,
    );
    await assert.rejects(verifier.verify(x.token), (e: unknown) => e instanceof TokenError && e.kind === "grant_revoked");
    await verifier.verify(later.token); // the restored store never revoked it
  } finally {
    stop.abort();
    await run;
    conn?.close();
    await s.stop();
    rmSync(backup, { recursive: true, force: true });
  }
});

// A verifier that starts (opens the feed at 0) behind 1,001 live
// tombstones is sent them in two messages, the rogue's in the second: it
// was ready, and fresh, with the first, and accepted the rogue's revoked
// token until the second arrived. A message that continues now neither
// readies nor refreshes it.
test("rogue34f: a verifier starting is not ready before the feed's head", async () => {
  const s = await startServer("--grant-max-per-node", "1100");
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  try {
    await revokeMany(s, "filler", maxFeedBatch);
    const rogue = await Agent.registerRoot(s.operator, "rogue");
    rogue.conn.close();
    const x = await s.operator.capability.issueRoot({ holderNodeId: rogue.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
    const revoked = await s.operator.capability.revoke({ target: { case: "grantId", value: x.grant!.grantId }, reason: "rogue" });
    const verifier = new Verifier({ conn: s.dial(s.adminToken), stalenessBudgetMs: 60_000 });
    const seen: { continues: boolean; tombstones: number; accepted: boolean }[] = [];
    feedHooks.set(verifier, async (msg) => {
      let accepted = true;
      try {
        await verifier.verify(x.token);
      } catch {
        accepted = false;
      }
      seen.push({ continues: msg.continues, tombstones: msg.tombstones.length, accepted });
    });
    run = verifier.run(stop.signal);
    await verifier.caughtUp(revoked.sequence);
    while (seen.length < 2) await new Promise((r) => setTimeout(r, 20));
    assert.ok(seen[0].tombstones === maxFeedBatch, `the feed opened at 0: ${JSON.stringify(seen)}`);
    assert.deepEqual(
      seen.filter((m) => m.accepted),
      [],
      `the starting verifier accepted the rogue's revoked token before the feed's head: ${JSON.stringify(seen)}`,
    );
    await assert.rejects(verifier.verify(x.token), (e: unknown) => e instanceof TokenError && e.kind === "grant_revoked");
  } finally {
    stop.abort();
    await run;
    await s.stop();
  }
});

// The verifier measured its feed's age on Date.now, which steps back when
// the host's clock is set back (an NTP step, a VM resumed): a feed that
// died then kept the verifier fresh, accepting tokens revoked meanwhile,
// for as long as the step. The age is now measured on a monotonic clock
// (unless one is injected), and a clock that went back past the feed's
// last message fails closed.
test("rogue34f: a clock set back does not keep a dead feed fresh", async () => {
  let s: TestServer | undefined = await startServer();
  const stop = new AbortController();
  let run: Promise<void> | undefined;
  const conn = Conn.dial(s.baseUrl, s.adminToken, { retry: { attempts: 1 } });
  try {
    let now = Date.now();
    const verifier = new Verifier({ conn, stalenessBudgetMs: 10_000, clock: { now: () => now } });
    run = verifier.run(stop.signal);
    await verifier.ready;
    await s.stop(); // the feed dies: nothing more is heard
    s = undefined;
    now -= 3_600_000; // the host's clock set back an hour
    now += 10_001; // and the budget passes with no message
    assert.throws(() => verifier.checkFresh(), (e: unknown) => e instanceof TokenError && e.kind === "feed_stale", "a feed dead for the budget was fresh");
  } finally {
    stop.abort();
    await run;
    conn.close();
    await s?.stop();
  }
});
