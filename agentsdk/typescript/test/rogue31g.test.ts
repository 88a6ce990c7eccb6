// The thirty-first hostile pass on the TypeScript SDK's offline verifier:
// the crafted tokens of agentsdk/testdata/rogue31g_tokens.json (signed by
// the key of its key set) get the control plane's verdict, which the Go
// verifier gives them (agentsdk/rogue31gcorpus_test.go writes the file and
// holds the Go verifier to it; the Python verifier is held to it too).
import assert from "node:assert/strict";
import { createPrivateKey, sign } from "node:crypto";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import http from "node:http";
import { describe, test } from "node:test";

import { createConnectTransport } from "@connectrpc/connect-node";

import { WatchRevocationsResponseSchema } from "../src/gen/tether/v1/capability_pb.js";
import { Conn, MaxCachedTokensPerHolder, parseJwks, TokenError, Verifier, verifyToken } from "../src/index.js";
import { streamMessage } from "./peer.js";

interface Case {
  name: string;
  token: string;
  accept: boolean;
  grant_id?: string;
  chain?: string[];
  scopes?: string[];
  expires_at_ms?: number;
}

// From dist/test/ (where the compiled test runs) to agentsdk/testdata.
const corpus = JSON.parse(readFileSync(new URL("../../../testdata/rogue31g_tokens.json", import.meta.url), "utf8")) as {
  jwks: unknown;
  issuer: string;
  now_ms: number;
  leeway_ms: number;
  cases: Case[];
};

describe("rogue31g: crafted tokens get the control plane's verdict", () => {
  const keys = parseJwks(corpus.jwks);
  const options = { issuer: corpus.issuer, leewayMs: corpus.leeway_ms };
  for (const c of corpus.cases) {
    test(c.name, () => {
      if (!c.accept) {
        assert.throws(() => verifyToken(c.token, (kid) => keys.get(kid), corpus.now_ms, options), TokenError);
        return;
      }
      const claims = verifyToken(c.token, (kid) => keys.get(kid), corpus.now_ms, options);
      assert.equal(claims.grantId, c.grant_id);
      assert.deepEqual(claims.chain, c.chain ?? []);
      assert.deepEqual(claims.scopes, c.scopes);
      assert.equal(claims.expiresAt.getTime(), c.expires_at_ms);
    });
  }
});

// A rogue mints itself a distinct token every second and presents each
// once to a tool server: the verifier cached every one until its cache was
// full, and every other caller's token, no longer cached, paid its
// signature check on every call. One holder now keeps at most
// MaxCachedTokensPerHolder entries, its next replacing its oldest.
describe("rogue31g: the verifier's cache", () => {
  test("a rogue minting tokens cannot fill it", async () => {
    // A control plane over HTTP/1.1 (the Conn's transport too): the key
    // set of the corpus, and a feed that says it is at its head.
    const server = http.createServer((req, res) => {
      if (req.url === "/.well-known/jwks.json") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(corpus.jwks));
        return;
      }
      req.resume();
      res.writeHead(200, { "content-type": "application/connect+proto" });
      res.write(streamMessage(WatchRevocationsResponseSchema, { headSequence: 1n }));
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    const conn = Conn.dial(url, "viewer", { transport: (auth) => createConnectTransport({ baseUrl: url, httpVersion: "1.1", interceptors: [auth] }) });
    const verifier = new Verifier({ conn, cacheSize: 16, clock: { now: () => corpus.now_ms } });
    const stop = new AbortController();
    const running = verifier.run(stop.signal);
    try {
      await verifier.ready;
      // The corpus key (a seed of 31s), to mint with.
      const jwk = (corpus.jwks as { keys: { kid: string; x: string }[] }).keys[0];
      const key = createPrivateKey({ key: { kty: "OKP", crv: "Ed25519", x: jwk.x, d: Buffer.alloc(32, 31).toString("base64url") }, format: "jwk" });
      const T = Math.floor(corpus.now_ms / 1000);
      const mint = (holder: string, iat: number) => {
        const enc = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
        const signing = `${enc({ alg: "EdDSA", kid: jwk.kid, typ: "JWT" })}.${enc({ iss: "tether", sub: holder, aud: ["tether-tools"], exp: iat + 300, nbf: iat, iat, jti: `g_${holder}`, chain: [], scopes: ["tool:shell"] })}`;
        return `${signing}.${sign(null, Buffer.from(signing), key).toString("base64url")}`;
      };
      for (let i = 0; i < 40; i++) await verifier.verify(mint("n_rogue", T - i));
      assert.equal(verifier.cached("n_rogue"), MaxCachedTokensPerHolder, "one holder's cached tokens");
      await verifier.verify(mint("n_honest", T));
      assert.equal(verifier.cached("n_honest"), 1, "an honest caller's token is cached after the rogue's");
      assert.equal(verifier.cached(), MaxCachedTokensPerHolder + 1);
    } finally {
      stop.abort();
      await running;
      conn.close();
      server.closeAllConnections();
      server.close();
    }
  });
});
