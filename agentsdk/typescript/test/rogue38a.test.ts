// The thirty-eighth hostile pass on the agent SDKs, the TypeScript SDK's
// part, through a real tether server: an honest parent (or operator) lists
// the subtree of its rogue child, who spawned children carrying every label
// allowed until the subtree is one answer larger than a connection reads.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { timestampDate } from "@bufbuild/protobuf/wkt";

import { Agent, Conn, listSubtree } from "../src/index.js";
import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** Every label a node may carry, each value as long as allowed. */
function fullLabels(i: number): Record<string, string> {
  const labels: Record<string, string> = { team: "rogue" };
  for (let k = 0; Object.keys(labels).length < 32; k++) {
    labels[`k${String(k).padStart(2, "0")}`] = `${String(i).padStart(2, "0")}-${"v".repeat(60)}`;
  }
  return labels;
}

describe("rogue38a: listing a rogue's large subtree", () => {
  test("listSubtree lists a subtree larger than one answer, a page at a time", async () => {
    const { agent: parent } = await server.rootAgent("rogue38a-parent");
    const spawned = await parent.spawn("rogue38a-rogue");
    const rogue = await Agent.join(server.baseUrl, spawned.credential, { retry: { attempts: 1 } });
    const count = 40;
    const resp = await rogue.conn.agent.spawnBatch({
      parentNodeId: rogue.nodeId,
      children: Array.from({ length: count }, (_, i) => ({ name: `grandchild-${String(i).padStart(2, "0")}`, labels: fullLabels(i) })),
    });
    const want = new Set([parent.nodeId, rogue.nodeId, ...resp.spawned.map((s) => s.node!.nodeId)]);

    // Connections that read at most 32 KiB an answer (about 13 of the
    // rogue's children), as a rogue subtree of ~3,800 such nodes exceeds
    // MaxMessageBytes: the subtree stays small.
    const sessions: Http2SessionManager[] = [];
    const small = (token: string): Conn =>
      Conn.dial(server.baseUrl, token, {
        retry: { attempts: 1 },
        transport: (auth) => {
          const sessionManager = new Http2SessionManager(server.baseUrl);
          sessions.push(sessionManager);
          return createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", sessionManager, interceptors: [auth], readMaxBytes: 32 << 10 });
        },
      });
    try {
      for (const [who, conn] of [["parent", small(parent.credential)], ["operator", small(server.adminToken)]] as const) {
        await assert.rejects(
          conn.agent.listNodes({ rootNodeId: parent.nodeId }),
          (err: unknown) => ConnectError.from(err).code === Code.ResourceExhausted,
          `${who}: the whole subtree's listing must be past what the connection reads`,
        );
        const nodes = await listSubtree(conn, { rootNodeId: parent.nodeId, pageSize: 8 });
        const got = new Set(nodes.map((n) => n.nodeId));
        assert.equal(got.size, nodes.length, `${who}: a node listed twice`);
        assert.deepEqual([...got].sort(), [...want].sort(), `${who}: listSubtree must list the subtree completely`);
        const selected = await listSubtree(conn, { rootNodeId: parent.nodeId, labelSelector: "team=rogue", pageSize: 8 });
        assert.equal(selected.length, count, `${who}: the selector applies to every page`);
      }
      const own = await listSubtree(rogue.conn, { pageSize: 8 });
      assert.equal(own.length, count + 1, "the rogue's own subtree when no root is named");
    } finally {
      for (const s of sessions) s.abort();
      rogue.conn.close();
    }
  });
});

/** Resolves once cond() holds, checked every 20 ms; rejects after ms (a guard against a hang, not a timing). */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  for (let waited = 0; !cond(); waited += 20) {
    if (waited >= ms) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("rogue38a: the stop's deadline follows the stop", () => {
  test("a child whose drain ends at the mark is told the confirmation deadline", async () => {
    // A rogue parent drains its honest child with a day's drain window and a
    // minute's wait for its exit. The child has no call in flight: its
    // drain ends at the mark, its grants are revoked, the record waits a
    // minute; no node changes then, so the session told it no deadline or
    // the day's. Heartbeats are rare here: the session must tell it the
    // minute's.
    const { agent: parent } = await server.rootAgent("rogue38a-rogue-parent");
    const spawned = await parent.spawn("rogue38a-child");
    const child = await Agent.join(server.baseUrl, spawned.credential, { retry: { attempts: 1 } });
    const stop = new AbortController();
    const session = child.run({ signal: stop.signal, heartbeatMs: 86_400_000 }).catch(() => {});
    try {
      await child.opened;
      const resp = await parent.conn.supervisor.terminate({
        nodeId: child.nodeId,
        mode: TerminationMode.DRAIN,
        drainWindow: { seconds: 86_400n },
        confirmTimeout: { seconds: 60n },
        reason: "rogue38a",
      });
      const asked = timestampDate(resp.termination!.requestedAt!).getTime();
      await until(() => child.drainDeadline !== undefined && child.drainDeadline.getTime() < asked + 3_600_000, 50_000, "the minute's confirmation deadline");
    } finally {
      stop.abort();
      await session;
      child.conn.close();
    }
  });
});
