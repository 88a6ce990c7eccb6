// The thirty-seventh hostile pass on the TypeScript SDK's Fence behind a
// ToolGate, through the real server, as the Go and Python SDKs' (rogue37c
// tests there too): an honest holder of a job lease exits; a stranger with
// a token for the tool calls it with the holder's job and generation. The
// fence's read named no caller, so the control plane kept the side effect
// on the exited holder as a tool call contradicting its exit (seen before
// the fix: one tool_call contradiction on the honest holder). Now the fence
// names the gate's call (gateCallId), the control plane reads the call's
// node from its ledger, refuses the stranger's side effect and keeps
// nothing on the holder.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, Fence, gateCallId, issuedGenerations, LeaseWorker, NoAuthority, ToolGate } from "../src/index.js";
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

describe("rogue37c: a stranger at a gated, fenced tool", () => {
  test("is refused under an exited holder's generation, and nothing is kept on the holder", async () => {
    const token = await server.operator.auth.createToken({ toolServer: "ts-rogue37c-tool", ttl: { seconds: 3600n } });
    const conn = server.dial(token.token);
    const fence = new Fence({ check: issuedGenerations(conn) });
    const gate = new ToolGate(conn, "ts-rogue37c-tool");
    stops.push(() => gate.close());
    await gate.ready;

    const honest = await Agent.registerRoot(server.operator, "ts-rogue37c-honest");
    stops.push(() => honest.close());
    const stranger = await Agent.registerRoot(server.operator, "ts-rogue37c-stranger");
    stops.push(() => stranger.close());
    const tokenOf = async (agent: Agent) =>
      (await server.operator.capability.issueRoot({ holderNodeId: agent.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } })).token;
    const honestToken = await tokenOf(honest);
    const strangerToken = await tokenOf(stranger);

    const offered = await server.operator.lease.offer({ jobId: "ts-rogue37c-job", holderIdentity: honest.nodeId, leaseDuration: { seconds: 300n } });
    const worker = new LeaseWorker({ conn: honest.conn, renewEveryMs: 600_000 });
    stops.push(() => void worker.close());
    const job = await worker.accept(offered.lease!);

    assert.equal(gateCallId(), "", "outside a gate's call");
    let seen = "";
    await gate.call(honestToken, "write", async () => {
      seen = gateCallId();
      await fence.admitHeaders(job.headers()); // the holder's own side effect, before its exit
    });
    assert.notEqual(seen, "", "inside a gate's call the call id is known");

    await honest.conn.agent.confirmExit({ nodeId: honest.nodeId, reason: "done, gone" });
    for (let i = 0; i < 2; i++) {
      await assert.rejects(
        gate.call(strangerToken, "write", () => fence.admitHeaders(job.headers())),
        (e: unknown) => {
          assert.ok(e instanceof NoAuthority, String(e));
          return true;
        },
      );
    }
    const node = (await server.operator.agent.getNode({ nodeId: honest.nodeId })).node!;
    assert.deepEqual(
      node.contradictions.map((c) => [c.kind, c.detail]),
      [],
      "the stranger's side effects framed the exited holder",
    );
  });

  test("is refused under a live holder's generation, even after the holder's answer was kept (maxStaleMs)", async () => {
    // Before the fix the fence judged headers, not callers: the stranger
    // wrote as the holder (seen failing: admitted).
    const token = await server.operator.auth.createToken({ toolServer: "ts-rogue37c-writer", ttl: { seconds: 3600n } });
    const conn = server.dial(token.token);
    const gate = new ToolGate(conn, "ts-rogue37c-writer");
    stops.push(() => gate.close());
    await gate.ready;
    const holder = await Agent.registerRoot(server.operator, "ts-rogue37c-holder");
    stops.push(() => holder.close());
    const stranger = await Agent.registerRoot(server.operator, "ts-rogue37c-stranger2");
    stops.push(() => stranger.close());
    const tokenOf = async (agent: Agent) =>
      (await server.operator.capability.issueRoot({ holderNodeId: agent.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } })).token;
    const holderToken = await tokenOf(holder);
    const strangerToken = await tokenOf(stranger);
    const offered = await server.operator.lease.offer({ jobId: "ts-rogue37c-live-job", holderIdentity: holder.nodeId, leaseDuration: { seconds: 300n } });
    const worker = new LeaseWorker({ conn: holder.conn, renewEveryMs: 600_000 });
    stops.push(() => void worker.close());
    const job = await worker.accept(offered.lease!);
    for (const maxStaleMs of [0, 3_600_000]) {
      const fence = new Fence({ check: issuedGenerations(conn), maxStaleMs, clock: { now: () => 0 } });
      await gate.call(holderToken, "write", () => fence.admitHeaders(job.headers()));
      await assert.rejects(
        gate.call(strangerToken, "write", () => fence.admitHeaders(job.headers())),
        (e: unknown) => {
          assert.ok(e instanceof NoAuthority, String(e));
          assert.match(String(e), /not the holder's/);
          return true;
        },
      );
      await gate.call(holderToken, "write", () => fence.admitHeaders(job.headers())); // the holder still writes
    }
  });
});
