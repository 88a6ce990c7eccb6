// The thirty-fifth hostile pass on the TypeScript SDK's Fence, through the
// real server, as the Go and Python SDKs' (rogue35a tests there too): a
// holder of a job lease claims its exit and goes on writing under its
// ACTIVE generation at a tool whose fence asks the coordinator. The fence
// admitted it until the lease's expiry (seen before the fix). Now the read
// says the holder exited (holderExited), the fence refuses (NoAuthority),
// and the control plane keeps the side effect on the holder as a tool call
// contradicting its exit.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, Fence, issuedGenerations, LeaseWorker, NoAuthority } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const stops: (() => void)[] = [];
let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  stops.forEach((s) => s());
  await server?.stop();
});

describe("rogue35a: a holder whose exit was confirmed, at a fenced tool", () => {
  test("is refused, and the attempt is kept on its node", async () => {
    const token = await server.operator.auth.createToken({ toolServer: "ts-rogue35a-tool", ttl: { seconds: 3600n } });
    const fence = new Fence({ check: issuedGenerations(server.dial(token.token)) });

    const rogue = await Agent.registerRoot(server.operator, "ts-rogue35a-rogue");
    stops.push(() => rogue.close());
    const honest = await Agent.registerRoot(server.operator, "ts-rogue35a-honest");
    stops.push(() => honest.close());
    const accept = async (agent: Agent, jobId: string) => {
      const offered = await server.operator.lease.offer({ jobId, holderIdentity: agent.nodeId, leaseDuration: { seconds: 300n } });
      const worker = new LeaseWorker({ conn: agent.conn, renewEveryMs: 600_000 });
      stops.push(() => void worker.close());
      return worker.accept(offered.lease!);
    };
    const rogueJob = await accept(rogue, "ts-rogue35a-rogue-job");
    const honestJob = await accept(honest, "ts-rogue35a-honest-job");
    await fence.admitHeaders(rogueJob.headers()); // before its exit: admitted

    await rogue.conn.agent.confirmExit({ nodeId: rogue.nodeId, reason: "done, gone" });
    await assert.rejects(fence.admitHeaders(rogueJob.headers()), (e: unknown) => {
      assert.ok(e instanceof NoAuthority, String(e));
      assert.match(String(e), /exit was confirmed/);
      return true;
    });
    const node = (await server.operator.agent.getNode({ nodeId: rogue.nodeId })).node!;
    const kept = node.contradictions.filter((c) => c.kind === "tool_call" && c.detail.includes("ts-rogue35a-tool"));
    assert.equal(kept.length, 1, `the rogue's contradictions: ${JSON.stringify(node.contradictions.map((c) => [c.kind, c.detail]))}`);

    await fence.admitHeaders(honestJob.headers()); // the honest holder still writes
    const h = (await server.operator.agent.getNode({ nodeId: honest.nodeId })).node!;
    assert.equal(h.contradictions.length, 0);
  });
});
