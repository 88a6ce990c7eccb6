// The thirty-ninth hostile pass on the TypeScript SDK's verifier: one
// whose conn holds an agent's credential follows only that agent's tree's
// revocations, yet it accepted any token the control plane signed. A
// rogue of another tree presented its token there, was revoked in its own
// tree, and was still served until its token expired, since the verifier
// never heard of the revocation. Tokens now name their tree (the root
// claim) and the feed the tree it follows (tree_root): the tree-scoped
// verifier refuses another tree's token ("tree_not_followed"); one
// following the whole feed is unchanged.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Agent, Conn, TokenError, Verifier } from "../src/index.js";
import { startServer } from "./server.js";

test("rogue39I: a tree-scoped verifier refuses another tree's token", async () => {
  const s = await startServer();
  const stop = new AbortController();
  const runs: Promise<void>[] = [];
  const ours = await Agent.registerRoot(s.operator, "ours");
  const rogue = await Agent.registerRoot(s.operator, "rogue");
  rogue.conn.close();
  const admin = Conn.dial(s.baseUrl, s.adminToken);
  try {
    const issue = (node: string) => s.operator.capability.issueRoot({ holderNodeId: node, scopes: ["tool:*"], ttl: { seconds: 3600n } });
    const own = await issue(ours.nodeId);
    const canary = await issue(ours.nodeId);
    const rogues = await issue(rogue.nodeId);

    const scoped = new Verifier({ conn: ours.conn, stalenessBudgetMs: 60_000 });
    const whole = new Verifier({ conn: admin, stalenessBudgetMs: 60_000 });
    runs.push(scoped.run(stop.signal), whole.run(stop.signal));
    await scoped.ready;
    await whole.ready;
    assert.equal(scoped.tree, ours.nodeId);
    assert.equal(whole.tree, "");
    for (const v of [scoped, whole]) await v.authorize(own.token, "tool:search");
    await whole.authorize(rogues.token, "tool:search");

    // The rogue is revoked in its own tree; then a revocation in ours, so
    // that the scoped verifier has heard the feed past the rogue's.
    await s.operator.capability.revoke({ target: { case: "grantId", value: rogues.grant!.grantId }, reason: "rogue" });
    const res = await s.operator.capability.revoke({ target: { case: "grantId", value: canary.grant!.grantId }, reason: "canary" });
    await scoped.caughtUp(res.sequence);
    await whole.caughtUp(res.sequence);
    await assert.rejects(scoped.verify(canary.token), (e: unknown) => e instanceof TokenError && e.kind === "grant_revoked");
    await assert.rejects(scoped.authorize(rogues.token, "tool:search"), (e: unknown) => {
      assert.ok(e instanceof TokenError && e.kind === "tree_not_followed", `want tree_not_followed, got ${String(e)}`);
      assert.ok(e.message.includes(ours.nodeId) && e.message.includes("another tree") && !e.message.includes(rogues.token), e.message);
      return true;
    });
    await assert.rejects(whole.authorize(rogues.token, "tool:search"), (e: unknown) => e instanceof TokenError && e.kind === "grant_revoked");
    await scoped.authorize(own.token, "tool:search");
  } finally {
    stop.abort();
    await Promise.allSettled(runs);
    ours.conn.close();
    admin.close();
    await s.stop();
  }
});
