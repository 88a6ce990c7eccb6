// A rogue agent (and its rogue inputs) against a tool server that uses the
// TypeScript SDK's ToolGate and Verifier, through the real server.
import assert from "node:assert/strict";
import { createHmac, generateKeyPairSync, sign } from "node:crypto";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";

import { Agent, CallResolution, Fence, Fenced, issuedGenerations, LeaseWorker, UnissuedGeneration, parseJwks, TokenError, Verifier, verifyToken, type Grant, type ToolCall } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;
const cleanups: (() => Promise<void>)[] = [];

before(async () => {
  server = await startServer();
});
after(async () => {
  await Promise.all(cleanups.map((c) => c()));
  await server?.stop();
});

/** A root agent and a child (its own process's Agent, session running) holding grant scopes. */
async function family(name: string, scopes = ["tool:search"]) {
  const root = await server.rootAgent(name);
  const spawned = await root.agent.spawn(`${name}-child`);
  const child = await Agent.join(server.baseUrl, spawned.credential);
  const stopChild = new AbortController();
  const childSession = child.run({ signal: stopChild.signal, heartbeatMs: 500 }).catch(() => {});
  await child.opened;
  const grant: Grant = await root.agent.delegate(root.grant.grant.grantId, child.nodeId, scopes, 600_000);
  const close = async () => {
    stopChild.abort();
    root.stopSession.abort();
    await Promise.all([childSession, root.session]);
    child.close();
  };
  cleanups.push(close);
  return { root, child, grant, close };
}

async function verifier() {
  const v = new Verifier({ conn: server.operator });
  const stop = new AbortController();
  const running = v.run(stop.signal);
  cleanups.push(async () => {
    stop.abort();
    await running;
  });
  await v.ready;
  return v;
}

const b64 = (b: Buffer | string) => Buffer.from(b).toString("base64url");
const kidOf = (token: string) => JSON.parse(Buffer.from(token.split(".")[0], "base64url").toString()).kid as string;

function refusedAs(kind: string, token?: string) {
  return (e: unknown) => {
    assert.ok(e instanceof TokenError, String(e));
    assert.equal(e.kind, kind, e.message);
    if (token) assert.ok(!e.message.includes(token), "the error never carries the token");
    return true;
  };
}

describe("rogue13: the gate", () => {
  test("a tool error that echoes the caller's token does not put it in the ledger", async () => {
    const recorded: ToolCall[] = [];
    const gate = await server.gate("rogue13-echo", { onRecorded: (c) => recorded.push(c) });
    const f = await family("echo");
    const token = f.grant.token;
    await assert.rejects(
      gate.call(token, "search", () => {
        throw new Error(`cannot parse the request with capability ${token} from the agent`);
      }),
      /cannot parse/,
    );
    assert.equal(recorded.length, 1);
    const err = recorded[0].error;
    assert.match(err, /cannot parse the request/);
    assert.ok(!err.includes(token), `the ledger keeps the token: ${err}`);
    assert.ok(!err.includes(token.split(".")[2].slice(0, 16)), `the ledger keeps a piece of the token's signature: ${err}`);
    await f.close();
  });

  test("the gate keeps no shared limit a rogue's open calls could fill", async () => {
    const gate = await server.gate("rogue13-flood");
    const rogue = await family("flooder");
    const honest = await family("honest");
    const held: { release: () => void; done: Promise<unknown> }[] = [];
    for (let i = 0; i < 20; i++) {
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      let begun!: () => void;
      const running = new Promise<void>((resolve) => (begun = resolve));
      const done = gate.call(rogue.grant.token, "search", async () => {
        begun();
        await released;
      });
      await Promise.race([running, done]);
      held.push({ release, done });
    }
    assert.equal(await gate.call(honest.grant.token, "search", () => "ok"), "ok");
    for (const h of held) h.release();
    await Promise.all(held.map((h) => h.done));
    await rogue.close();
    await honest.close();
  });
});

describe("rogue13: ending calls", () => {
  test("no one but the gate that began a call ends or acknowledges it; a second end keeps the first", async () => {
    const recorded: ToolCall[] = [];
    const gate = await server.gate("rogue13-owner", { onRecorded: (c) => recorded.push(c) });
    const other = await server.gate("rogue13-other");
    const f = await family("ender");
    let callId = "";
    await gate.call(f.grant.token, "search", async () => {
      const open = await server.operator.tool.listCalls({ nodeId: f.child.nodeId });
      callId = open.calls[0].callId;
      for (const [conn, gateId] of [
        [f.child.conn, gate.id],
        [other.conn, other.id],
        [other.conn, gate.id],
      ] as const) {
        await assert.rejects(conn.tool.endCall({ callId, gateId }), (e: unknown) => {
          assert.ok(e instanceof ConnectError && [Code.PermissionDenied, Code.NotFound, Code.FailedPrecondition].includes(e.code), String(e));
          return true;
        });
        await assert.rejects(conn.tool.cancelAck({ callId, gateId }), ConnectError);
      }
      const still = await server.operator.tool.listCalls({ nodeId: f.child.nodeId });
      assert.deepEqual(still.calls.map((c) => c.callId), [callId], "a rogue ended the call");
      return "done";
    });
    assert.equal(recorded[0].resolution, CallResolution.COMPLETED);
    const again = await gate.conn.tool.endCall({ callId, gateId: gate.id, failed: true, error: "rewritten" });
    assert.equal(again.call?.resolution, CallResolution.COMPLETED);
    assert.equal(again.call?.error, "");
    await f.close();
  });
});

describe("rogue13: the verifier", () => {
  test("alg none and HS256 keyed with the public key are refused", async () => {
    const f = await family("algs");
    const v = await verifier();
    const [, payload] = f.grant.token.split(".");
    const kid = kidOf(f.grant.token);
    const none = `${b64(JSON.stringify({ alg: "none", kid }))}.${payload}.`;
    await assert.rejects(v.verify(none), refusedAs("token_algorithm"));
    const jwks = (await (await fetch(server.baseUrl + "/.well-known/jwks.json")).json()) as { keys: { kid: string; x: string }[] };
    const x = jwks.keys.find((k) => k.kid === kid)!.x;
    for (const secret of [Buffer.from(x), Buffer.from(x, "base64url")]) {
      const h = b64(JSON.stringify({ alg: "HS256", kid, typ: "JWT" }));
      const sig = createHmac("sha256", secret).update(`${h}.${payload}`).digest("base64url");
      await assert.rejects(v.verify(`${h}.${payload}.${sig}`), refusedAs("token_algorithm"));
    }
    await f.close();
  });

  test("a rogue key named by jku, x5u or an embedded jwk is never fetched nor trusted", async () => {
    const { publicKey, privateKey } = generateKeyPairSync("ed25519");
    const x = publicKey.export({ format: "jwk" }).x!;
    const hits: string[] = [];
    const rogueJwks: Server = createServer((req, res) => {
      hits.push(req.url ?? "");
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", kid: "rogue-kid", x }] }));
    });
    await new Promise<void>((resolve) => rogueJwks.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(rogueJwks.address() as { port: number }).port}/jwks.json`;
    try {
      const f = await family("jku", ["tool:*"]);
      const v = await verifier();
      const [, payload] = f.grant.token.split(".");
      for (const extra of [{ jku: url }, { x5u: url }, { jwk: { kty: "OKP", crv: "Ed25519", x } }]) {
        const h = b64(JSON.stringify({ alg: "EdDSA", kid: "rogue-kid", ...extra }));
        const sig = sign(null, Buffer.from(`${h}.${payload}`), privateKey).toString("base64url");
        await assert.rejects(v.verify(`${h}.${payload}.${sig}`), refusedAs("unknown_key"));
      }
      // The rogue keeps the token's claims but signs with its key under the control plane's kid.
      const h = b64(JSON.stringify({ alg: "EdDSA", kid: kidOf(f.grant.token), jku: url }));
      const sig = sign(null, Buffer.from(`${h}.${payload}`), privateKey).toString("base64url");
      await assert.rejects(v.verify(`${h}.${payload}.${sig}`), refusedAs("token_signature"));
      assert.deepEqual(hits, [], "the verifier fetched a key set the token named");
      await f.close();
    } finally {
      rogueJwks.close();
    }
  });

  test("a token for another audience or issuer is refused even under a key the verifier trusts", async () => {
    // The rogue cannot sign under the control plane's key: the check is
    // shown with a key the lookup trusts, holding a real token's claims.
    const f = await family("audience");
    const { publicKey, privateKey } = generateKeyPairSync("ed25519");
    const claims = JSON.parse(Buffer.from(f.grant.token.split(".")[1], "base64url").toString()) as Record<string, unknown>;
    const mint = (over: Record<string, unknown>) => {
      const h = b64(JSON.stringify({ alg: "EdDSA", kid: "trusted" }));
      const p = b64(JSON.stringify({ ...claims, ...over }));
      return `${h}.${p}.${sign(null, Buffer.from(`${h}.${p}`), privateKey).toString("base64url")}`;
    };
    const keys = (kid: string) => (kid === "trusted" ? publicKey : undefined);
    verifyToken(mint({}), keys, Date.now());
    for (const aud of ["other-tool-server", ["tether-api"], [], "tether"]) {
      assert.throws(() => verifyToken(mint({ aud }), keys, Date.now()), refusedAs("token_audience"));
    }
    assert.throws(() => verifyToken(mint({ iss: "rogue" }), keys, Date.now()), refusedAs("token_issuer"));
    await f.close();
  });

  test("expired and not-yet-valid tokens are refused", async () => {
    // The verifier's checks at another time: verifyToken is what it runs
    // (its injected clock also measures the feed's staleness).
    const f = await family("times");
    const jwks = parseJwks(await (await fetch(server.baseUrl + "/.well-known/jwks.json")).json());
    const keys = (kid: string) => jwks.get(kid);
    const now = Date.now();
    verifyToken(f.grant.token, keys, now);
    assert.throws(() => verifyToken(f.grant.token, keys, now + 3600_000), refusedAs("token_expired", f.grant.token));
    assert.throws(() => verifyToken(f.grant.token, keys, now - 3600_000), refusedAs("token_not_yet_valid", f.grant.token));
    await f.close();
  });

  test("scopes wider than the grant are refused", async () => {
    const f = await family("wider");
    const v = await verifier();
    for (const wider of ["tool:*", "tool:search*", "tool:shell", "tool:", "tool:search:x"]) {
      await assert.rejects(v.authorize(f.grant.token, wider), refusedAs("scope_not_granted", f.grant.token));
    }
    await f.close();
  });

  test("oversized and deeply nested tokens are refused before any signature work", async () => {
    const v = await verifier();
    await assert.rejects(v.verify("a".repeat(9000) + ".b.c"), refusedAs("token_too_large"));
    const deep = b64("[".repeat(2500) + "]".repeat(2500));
    await assert.rejects(v.verify(`${deep}.e30.AA`), refusedAs("token_malformed"));
  });

  test("a revoked grant's token, and a terminated holder's, are refused once the feed delivers", async () => {
    const f = await family("revoked");
    const v = await verifier();
    await v.verify(f.grant.token);
    const revoked = await server.operator.capability.revoke({ target: { case: "grantId", value: f.grant.grant.grantId }, reason: "rogue" });
    await v.caughtUp(revoked.sequence);
    await assert.rejects(v.verify(f.grant.token), refusedAs("grant_revoked", f.grant.token));

    const g = await family("terminated");
    await v.verify(g.grant.token);
    await server.terminate(g.child.nodeId, "abort");
    // The control plane revokes the holder's grants as it stops it: poll
    // the verifier (bounded by the staleness budget) until the feed has it.
    const deadline = Date.now() + 10_000;
    for (;;) {
      const err = await v.verify(g.grant.token).then(
        () => undefined,
        (e: unknown) => e,
      );
      if (err instanceof TokenError && err.kind === "grant_revoked") break;
      assert.ok(Date.now() < deadline, `the terminated holder's token still verifies: ${String(err)}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    await f.close();
    await g.close();
  });
});

describe("rogue13: the lease worker and the fence", () => {
  test("forged fencing headers neither pass nor fence the real holder out; a superseded generation is fenced", async () => {
    const f = await family("fenced");
    const rogue = await family("fence-rogue");
    const jobId = "ts-rogue13-fence";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n } });
    const worker = new LeaseWorker({ conn: f.child.conn, renewEveryMs: 60_000 });
    const job = await worker.accept(offered.lease!);
    const toolServer = await server.operator.auth.createToken({ toolServer: "rogue13-fenced-tool", ttl: { seconds: 3600n } });
    const fence = new Fence({ check: issuedGenerations(server.dial(toolServer.token)) });

    // The rogue claims a generation nobody holds, and a job nobody leased.
    await assert.rejects(fence.admitHeaders({ "tether-job-id": jobId, "tether-lease-generation": "99" }), UnissuedGeneration);
    await assert.rejects(fence.admitHeaders(new Headers({ "Tether-Job-Id": "no-such-job", "Tether-Lease-Generation": "1" })), UnissuedGeneration);
    for (const bad of ["0", "-1", "01", "1e3", " 1", "18446744073709551616", ""]) {
      await assert.rejects(fence.admitHeaders({ "tether-job-id": jobId, "tether-lease-generation": bad }), RangeError, bad);
    }
    assert.ok(fence.highest(jobId) <= 1n, "a refused claim raised the fence above the generation issued");
    // The real holder still writes.
    await fence.admitHeaders(new Headers(job.headers()));

    // A peer that does not coordinate the job cannot cancel it.
    await assert.rejects(rogue.child.conn.lease.requestCancel({ jobId, reason: "rogue" }), ConnectError);
    assert.equal((await server.operator.lease.getLease({ jobId })).lease?.cancelRequested, false);

    // Reassigned: generation 2 writes, the old holder is fenced.
    const gen2 = await server.operator.lease.reassign({ jobId, holderIdentity: f.child.nodeId, leaseDuration: { seconds: 30n }, reason: "test" });
    const job2 = await worker.accept(gen2.lease!);
    await fence.admitHeaders(new Headers(job2.headers()));
    assert.equal(fence.highest(jobId), gen2.lease!.leaseGeneration);
    await assert.rejects(fence.admitHeaders(new Headers(job.headers())), Fenced);
    job.stop();
    job2.stop();
    await f.close();
    await rogue.close();
  });
});
