// The forty-fourth hostile pass on the SDK clients that page through the
// control plane's answers (letter C), the TypeScript SDK's part, through a
// real tether server: a rogue path to the control plane (a proxy, or a
// replica under a rogue's control: here an interceptor on the HTTP/2 dial)
// forges the pages an honest operator reads when it lists a rogue's
// subtree with listSubtree. Before, listSubtree refused only a next page
// token equal to the one it asked with: a path that answered an earlier
// page's token (two pages pointing at each other) or a fresh token with
// every page kept it asking for ever.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Agent, Conn, listSubtree, MaxPages } from "../src/index.js";
import { ListNodesResponseSchema, type ListNodesRequest, type ListNodesResponse } from "../src/gen/tether/v1/agent_pb.js";
import { dialThrough as dialPath } from "./roguepath.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

// The rogue path: forge answers each ListNodes call (its number, the
// request, and a call of the real server), every other call relayed. Past
// limit calls the test stops the read: the controller aborts and the call
// is refused.
function dialThrough(
  token: string,
  limit: number,
  forge: (n: number, req: ListNodesRequest, real: () => Promise<ListNodesResponse>) => Promise<ListNodesResponse>,
): { conn: Conn; stop: AbortController; calls: () => number; close: () => void } {
  const stop = new AbortController();
  let calls = 0;
  let frame: Awaited<ReturnType<Parameters<Interceptor>[0]>> | undefined;
  const rogue: Interceptor = (next) => async (req) => {
    if (req.method.name !== "ListNodes") return next(req);
    calls++;
    if (calls > limit) {
      stop.abort();
      throw new ConnectError("stopped by the test", Code.Canceled);
    }
    const real = async (): Promise<ListNodesResponse> => {
      frame = await next(req);
      return frame.message as ListNodesResponse;
    };
    const message = await forge(calls, req.message as ListNodesRequest, real);
    if (frame === undefined) await real();
    // The forged message in the last real answer's frame (its headers).
    return { ...frame!, message } as Awaited<ReturnType<typeof next>>;
  };
  const { conn, closeSessions } = dialPath(server.baseUrl, token, rogue);
  return {
    conn,
    stop,
    calls: () => calls,
    close: () => {
      conn.close();
      closeSessions();
    },
  };
}

// A parent whose rogue child spawned 20 children: 22 nodes, three pages of 8.
async function rogueSubtree(name: string): Promise<string> {
  const { agent: parent } = await server.rootAgent(name);
  const spawned = await parent.spawn(`${name}-rogue`);
  const rogue = await Agent.join(server.baseUrl, spawned.credential, { retry: { attempts: 1 } });
  try {
    await rogue.conn.agent.spawnBatch({ parentNodeId: rogue.nodeId, children: Array.from({ length: 20 }, (_, i) => ({ name: `grandchild-${i}` })) });
  } finally {
    rogue.conn.close();
  }
  return parent.nodeId;
}

describe("rogue44C: listSubtree against a path that forges its pages", () => {
  test("a path that cycles the pages ends the listing with an error", async () => {
    const root = await rogueSubtree("rogue44c-cycle");
    // The third page's answer names the second page as the next.
    const tokens: string[] = [];
    const path = dialThrough(server.adminToken, 200, async (_n, req, real) => {
      const resp = await real();
      if (tokens.length < 2) tokens.push(resp.nextPageToken);
      else if (req.pageToken === tokens[1]) return { ...resp, nextPageToken: tokens[0]! };
      return resp;
    });
    try {
      const got: unknown = await listSubtree(path.conn, { rootNodeId: root, pageSize: 8 }, { signal: path.stop.signal }).then(
        (nodes) => `${nodes.length} nodes`,
        (err: unknown) => err,
      );
      assert.ok(
        !path.stop.signal.aborted && path.calls() <= 4 && got instanceof Error && /already read/.test(got.message),
        `listSubtree asked ${path.calls()} pages and ended with ${String(got)}; want an error at the 4th page, the token of the 2nd answered again`,
      );
    } finally {
      path.close();
    }
  });

  test("a path that answers a fresh token with every page is read at most MaxPages answers", async () => {
    const root = await rogueSubtree("rogue44c-fresh");
    const path = dialThrough(server.adminToken, MaxPages + 100, async (n, _req, real) => {
      if (n === 1) await real();
      return create(ListNodesResponseSchema, { nextPageToken: `node-forged-${n}` });
    });
    try {
      const got: unknown = await listSubtree(path.conn, { rootNodeId: root, pageSize: 8 }, { signal: path.stop.signal }).then(
        (nodes) => `${nodes.length} nodes`,
        (err: unknown) => err,
      );
      assert.ok(
        !path.stop.signal.aborted && path.calls() <= MaxPages && got instanceof Error && /MaxPages/.test(got.message),
        `listSubtree asked ${path.calls()} pages and ended with ${String(got)}; want an error after at most MaxPages (${MaxPages})`,
      );
    } finally {
      path.close();
    }
  });

  test("a page of more nodes than the page size is refused", async () => {
    const root = await rogueSubtree("rogue44c-big");
    const path = dialThrough(server.adminToken, 10, async (_n, _req, real) => {
      const resp = await real();
      const nodes = [...resp.nodes];
      while (nodes.length < 9) nodes.push(nodes[0]!);
      return { ...resp, nodes, nextPageToken: "" };
    });
    try {
      const got: unknown = await listSubtree(path.conn, { rootNodeId: root, pageSize: 8 }, { signal: path.stop.signal }).then(
        (nodes) => `${nodes.length} nodes`,
        (err: unknown) => err,
      );
      assert.ok(got instanceof Error && /at most 8/.test(got.message), `listSubtree in pages of 8 ended with ${String(got)}`);
    } finally {
      path.close();
    }
  });
});
