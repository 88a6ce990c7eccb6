// The thirty-second hostile pass on the TypeScript SDK: a rogue on the
// honest agents' address (a NAT, a shared host) spends the address's
// budget for requests without a valid credential with forged tokens; an
// honest child joining with its fresh credential (which must be verified,
// paid from that budget) was refused resource_exhausted and the SDK threw
// it at the agent, though the refusal said when to come back (Retry-After).
// A unary call refused resource_exhausted with a retry hint is now sent
// again after the hint, a bounded number of times.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { Agent, Conn, DefaultRetry, retryHintMs } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;
// Children spawned before the limited server's start: a credential the
// control plane minted is remembered as verified as it is minted (since
// the thirty-third pass), so a child's credential not yet verified is one
// kept across a restart. Each test takes its own (fresh()).
const children: { node: { nodeId: string }; credential: string }[] = [];
before(async () => {
  const first = await startServer();
  const parent = await Agent.registerRoot(first.operator, "parent");
  for (let k = 0; k < 3; k++) children.push(await parent.spawn(`child${k}`));
  parent.conn.close();
  // Half a request a second: bursts of one, a second request two seconds later.
  server = await first.restart("--anonymous-rate-limit", "0.5");
});
after(async () => {
  await server?.stop();
});

/** token with one character of its signature changed: well formed, refused once verified. */
function forged(token: string, n: number): string {
  const i = token.length - 2 - (n % 40);
  const c = token[i] === "A" ? "B" : "A";
  return token.slice(0, i) + c + token.slice(i + 1);
}

describe("rogue32e: resource_exhausted with a retry hint", () => {
  /** A child whose credential the server has not verified. */
  function fresh() {
    const child = children.pop();
    assert.ok(child, "no child left");
    return child;
  }

  /** Has a rogue, on connections of its own, spend the address's budget. */
  async function spend(credential: string): Promise<void> {
    for (let k = 0; k < 16; k++) {
      const c = Conn.dial(server.baseUrl, forged(credential, k), { retry: { attempts: 1 } });
      try {
        await c.auth.whoAmI({});
        assert.fail("a forged token was admitted");
      } catch (err) {
        const code = ConnectError.from(err).code;
        if (code === Code.ResourceExhausted) return;
        assert.equal(code, Code.Unauthenticated, String(err));
      } finally {
        c.close();
      }
    }
    assert.fail("16 forged tokens never spent the address's budget");
  }

  test("rogue32e: without retries a join is refused, with the hint", async () => {
    const child = fresh();
    await spend(child.credential);
    await assert.rejects(Agent.join(server.baseUrl, child.credential, { retry: { attempts: 1 } }), (err: unknown) => {
      assert.equal(ConnectError.from(err).code, Code.ResourceExhausted);
      const hint = retryHintMs(err);
      assert.ok(hint !== undefined && hint > 0 && hint <= 2000, `hint ${hint}`);
      return true;
    });
  });

  test("rogue32e: by default a join refused by the address's budget is retried after the hint", async () => {
    const child = fresh();
    await spend(child.credential);
    const waits: number[] = [];
    // The SDK's own wait, recorded: the server's budget refills with time.
    const agent = await Agent.join(server.baseUrl, child.credential, {
      retry: {
        ...DefaultRetry,
        jitter: () => 0,
        wait: (ms) => {
          waits.push(ms);
          return new Promise((r) => setTimeout(r, ms));
        },
      },
    });
    try {
      assert.equal(agent.nodeId, child.node.nodeId);
      assert.equal(waits.length, 1, `waits ${waits}`);
      assert.ok(waits[0] > 0 && waits[0] <= 2000, `the wait ${waits[0]}, want the hint (up to two seconds)`);
    } finally {
      agent.conn.close();
    }
  });

  test("rogue32e: a budget kept spent is retried a bounded number of times", async () => {
    const child = fresh();
    await spend(child.credential);
    let waits = 0;
    // No time passes between attempts: the budget stays spent.
    await assert.rejects(
      Agent.join(server.baseUrl, child.credential, { retry: { ...DefaultRetry, wait: async () => void waits++ } }),
      (err: unknown) => ConnectError.from(err).code === Code.ResourceExhausted,
    );
    assert.equal(waits, DefaultRetry.attempts - 1);
    // A deadline closer than the hint: refused at once.
    waits = 0;
    const c = Conn.dial(server.baseUrl, child.credential, { timeoutMs: 500, retry: { ...DefaultRetry, wait: async () => void waits++ } });
    try {
      await assert.rejects(c.auth.whoAmI({}), (err: unknown) => ConnectError.from(err).code === Code.ResourceExhausted);
      assert.equal(waits, 0);
    } finally {
      c.close();
    }
  });

  test("rogue32e: a refusal without a hint has none", () => {
    assert.equal(retryHintMs(new ConnectError("too many streams", Code.ResourceExhausted)), undefined);
    assert.equal(retryHintMs(new ConnectError("x", Code.ResourceExhausted, { "retry-after": "3" })), 3000);
    assert.equal(retryHintMs(new ConnectError("x", Code.Unavailable, { "retry-after": "3" })), undefined);
  });
});
