// The thirty-eighth hostile pass on the TypeScript SDK's Fence behind a
// ToolGate, through the real server, as the Go and Python SDKs' (rogue38c
// tests there too): a holder's gated call is under way when its exit is
// confirmed and its job goes to another agent (generation 2); the call then
// attempts a side effect under its own generation 1. The fence refused it on
// its own, without asking, so nothing reached the control plane and the
// exited agent's record read confirmed (seen failing before the fix: no
// contradiction on the former holder). Now a gated fence asks about a
// superseded generation too, naming the call, and the control plane keeps
// it on the call's node (its own call) as a tool call after its exit.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, Fence, Fenced, issuedGenerations, LeaseWorker, ToolGate } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const stops: (() => void | Promise<void>)[] = [];
let server: TestServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  for (const s of stops) await s();
  await server?.stop();
});

describe("rogue38C: a former holder's gated side effect under its superseded generation", () => {
  test("is refused and kept on it after its exit; an ungated one asks nothing", async () => {
    const token = await server.operator.auth.createToken({ toolServer: "ts-rogue38c-tool", ttl: { seconds: 3600n } });
    const conn = server.dial(token.token);
    const check = issuedGenerations(conn);
    let asked = 0;
    const fence = new Fence({
      check: (job, generation) => {
        asked++;
        return check(job, generation);
      },
    });
    const gate = new ToolGate(conn, "ts-rogue38c-tool");
    stops.push(() => gate.close());
    await gate.ready;

    const former = await Agent.registerRoot(server.operator, "ts-rogue38c-former");
    stops.push(() => former.close());
    const next = await Agent.registerRoot(server.operator, "ts-rogue38c-next");
    stops.push(() => next.close());
    const formerToken = (await server.operator.capability.issueRoot({ holderNodeId: former.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } })).token;

    const offered = await server.operator.lease.offer({ jobId: "ts-rogue38c-job", holderIdentity: former.nodeId, leaseDuration: { seconds: 300n } });
    const worker = new LeaseWorker({ conn: former.conn, renewEveryMs: 600_000 });
    stops.push(() => void worker.close());
    await worker.accept(offered.lease!);
    const first = offered.lease!.leaseGeneration;
    const jobId = offered.lease!.jobId;

    await assert.rejects(
      gate.call(formerToken, "write", async () => {
        await former.conn.agent.confirmExit({ nodeId: former.nodeId, reason: "done, gone" });
        const moved = await server.operator.lease.reassign({ jobId: jobId, holderIdentity: next.nodeId, leaseDuration: { seconds: 300n } });
        fence.observe(jobId, moved.lease!.leaseGeneration);
        asked = 0;
        await fence.admit(jobId, first);
      }),
      (e: unknown) => {
        assert.ok(e instanceof Fenced, String(e));
        return true;
      },
    );
    assert.equal(asked, 1, "the gated fence asked about the superseded generation");
    const node = (await server.operator.agent.getNode({ nodeId: former.nodeId })).node!;
    const kept = node.contradictions.filter((c) => c.detail.includes("superseded"));
    assert.equal(kept.length, 1, `the former holder's side effect after its exit was not kept: ${JSON.stringify(node.contradictions.map((c) => c.detail))}`);
    assert.equal(kept[0].kind, "tool_call");

    // Outside a gate the fence refuses on its own: its read would name no
    // caller, and could frame any former holder.
    asked = 0;
    await assert.rejects(fence.admit(jobId, first), (e: unknown) => e instanceof Fenced);
    assert.equal(asked, 0, "an ungated fence asked about a superseded generation");
  });
});
