// The thirty-first hostile pass on the TypeScript SDK's offline verifier:
// the crafted tokens of agentsdk/testdata/rogue31g_tokens.json (signed by
// the key of its key set) get the control plane's verdict, which the Go
// verifier gives them (agentsdk/rogue31gcorpus_test.go writes the file and
// holds the Go verifier to it; the Python verifier is held to it too).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { parseJwks, TokenError, verifyToken } from "../src/index.js";

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
