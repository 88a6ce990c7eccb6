// The fortieth hostile pass on the TypeScript SDK's verifier, through a
// real tether server: a rogue whose children each present four tokens
// filled the verifier's cache of verified tokens, which then cached
// nothing more, so that every honest caller's token paid its signature
// check on every call; and each entry kept the token itself beside its
// claims of any size. The cache now keeps a token's SHA-256, caches no
// claims past MaxCachedClaimBytes, and a full cache takes an honest
// lineage's token in place of the rogue's, whose lineage keeps at most an
// eighth of it (the Go verifier's rule, rogue40f test).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { MaxCachedTokensPerHolder, Verifier } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

test("rogue40M: a rogue lineage cannot fill a tool server's verifier cache", async () => {
  const rogue = await server.rootAgent("rogue40M-rogue");
  const honest = await server.rootAgent("rogue40M-honest", ["tool:search"]);
  const cacheSize = 64;
  const verifier = new Verifier({ conn: server.dial(server.adminToken), stalenessBudgetMs: 60_000, cacheSize });
  const stop = new AbortController();
  const running = verifier.run(stop.signal);
  try {
    await verifier.ready;
    const children = cacheSize / MaxCachedTokensPerHolder;
    const spawned = await rogue.agent.conn.agent.spawnBatch({
      parentNodeId: rogue.agent.nodeId,
      children: Array.from({ length: children + 1 }, (_, i) => ({ name: `filler-${i}` })),
    });
    const nodes = spawned.spawned.map((s) => s.node!.nodeId);
    const delegate = async (child: string, scopes: string[]) => (await rogue.agent.delegate(rogue.grant.grant.grantId, child, scopes, 600_000)).token;

    // A token of 32 scopes of 128 bytes (4 KiB of claims) is verified,
    // not cached.
    const large = Array.from({ length: 32 }, (_, i) => "tool:" + String(i).padStart(2, "0").repeat(61) + "*");
    const big = nodes[children];
    await verifier.verify(await delegate(big, large));
    assert.equal(verifier.cached(big), 0, "a token carrying 4 KiB of claims is cached");

    // Four small tokens of each child fill the cache.
    for (const child of nodes.slice(0, children)) {
      for (let i = 0; i < MaxCachedTokensPerHolder; i++) await verifier.verify(await delegate(child, [`tool:search${i}`]));
    }
    assert.equal(verifier.cached(), cacheSize, "the rogue's lineage fills the cache while it is not full");
    // An honest agent's token, verified twice, is kept.
    for (let i = 0; i < 2; i++) await verifier.authorize(honest.grant.token, "tool:search");
    assert.equal(
      verifier.cached(honest.agent.nodeId),
      1,
      `the honest agent's token is not cached once the rogue's lineage filled the cache (${cacheSize} entries): it pays its signature check on every call`,
    );
    // The rogue's next tokens replace its own lineage's oldest.
    for (const child of nodes.slice(0, 4)) await verifier.verify(await delegate(child, ["tool:search"]));
    assert.equal(verifier.cached(honest.agent.nodeId), 1, "the rogue's tokens pushed out the honest agent's");
    assert.ok(verifier.cached() <= cacheSize, `the cache holds ${verifier.cached()} entries, over ${cacheSize}`);
  } finally {
    stop.abort();
    await running;
  }
});
