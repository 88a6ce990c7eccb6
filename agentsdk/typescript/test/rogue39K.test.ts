// The thirty-ninth hostile pass on the TypeScript SDK's TetherScope: a
// sub-agent (an adapter's handoff) is spawned, granted and joined, then
// child() waits for its session to open. Against a peer standing where the
// control plane would (a proxy gone wrong, a hostile control plane) that
// holds the session's stream without its opening message, or a control
// plane out of reach (the session loop reconnects for ever), that wait had
// no bound: child() never settled, and the handoff, the run behind it and
// the honest agent's exit with them were held for ever. endUnused, the
// same wait for a child that never ran, was already bounded by the
// connection's timeoutMs. child() now rejects deadline_exceeded once the
// connection's timeoutMs passed without the session open, having stopped
// the session and claimed the child's exit (it will never run).
import assert from "node:assert/strict";
import type http2 from "node:http2";
import { after, test } from "node:test";

import { create, fromBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { Agent, TetherScope, ToolGate } from "../src/index.js";
import { ConfirmExitRequestSchema, ConfirmExitResponseSchema, GetNodeResponseSchema, SpawnResponseSchema } from "../src/gen/tether/v1/agent_pb.js";
import { WhoAmIResponseSchema } from "../src/gen/tether/v1/auth_pb.js";
import { DelegateResponseSchema, GrantSchema } from "../src/gen/tether/v1/capability_pb.js";
import { Peer, respondStream, unary } from "./peer.js";

const peers: Peer[] = [];
after(async () => {
  for (const p of peers) await p.stop();
});

/** The node a request's bearer credential belongs to, in this peer. */
function nodeOf(headers: http2.IncomingHttpHeaders): string {
  return String(headers.authorization) === "Bearer child-credential" ? "n-rogue39k-child" : "n-rogue39k-parent";
}

test("rogue39K: a sub-agent's session the peer never opens does not hold child() for ever", async () => {
  const confirmed: { node: string; reason: string }[] = [];
  const sessions: http2.ServerHttp2Stream[] = [];
  const peer = new Peer({
    WhoAmI: (stream, headers) => unary(stream, WhoAmIResponseSchema, { nodeId: nodeOf(headers) }),
    GetNode: (stream, headers) => unary(stream, GetNodeResponseSchema, { node: { nodeId: nodeOf(headers), name: nodeOf(headers) } }),
    Spawn: (stream) =>
      unary(stream, SpawnResponseSchema, { node: { nodeId: "n-rogue39k-child", name: "helper" }, credential: "child-credential" }),
    Delegate: (stream) =>
      unary(stream, DelegateResponseSchema, {
        grant: { grantId: "g-rogue39k-child", holderNodeId: "n-rogue39k-child", scopes: ["tool:search"] },
        token: "child-capability-token",
        tokenExpiresAt: timestampFromMs(Date.now() + 3_600_000),
      }),
    // The session's headers, then nothing: no opening message, no end.
    Session: (stream) => {
      sessions.push(stream);
      respondStream(stream);
    },
    // The gate's cancel orders: an open stream that stays quiet.
    WatchCancels: (stream) => respondStream(stream),
    ConfirmExit: (stream, headers) => {
      const chunks: Buffer[] = [];
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("end", () => {
        confirmed.push({ node: nodeOf(headers), reason: fromBinary(ConfirmExitRequestSchema, Buffer.concat(chunks)).reason });
        unary(stream, ConfirmExitResponseSchema, {});
      });
    },
  });
  await peer.start();
  peers.push(peer);

  const dial = { timeoutMs: 2000 };
  const parent = await Agent.join(peer.url, "parent-credential", dial);
  const gate = new ToolGate(parent.conn, "gate-rogue39k");
  const token = parent.capabilityToken({
    grant: create(GrantSchema, { grantId: "g-rogue39k", holderNodeId: "n-rogue39k-parent", scopes: ["tool:search"] }),
    token: "parent-capability-token",
    expiresAt: new Date(Date.now() + 3_600_000),
  });
  const scope = new TetherScope(parent, gate, token, undefined, dial);

  // A guard against a child() that never settles (the failure this test
  // is about), not a timing: the bound under test is the connection's 2 s.
  let guard: ReturnType<typeof setTimeout> | undefined;
  const never = new Promise<"held">((resolve) => (guard = setTimeout(() => resolve("held"), 60_000)));
  try {
    const outcome = await Promise.race([
      scope.child("helper", { scopes: ["tool:search"] }).then(
        () => "opened" as const,
        (err: unknown) => err,
      ),
      never,
    ]);
    assert.notEqual(outcome, "held", "child() never settled: the sub-agent's session never opened, and nothing bounded the wait");
    assert.ok(outcome instanceof ConnectError, `child() settled with ${String(outcome)}`);
    assert.equal(outcome.code, Code.DeadlineExceeded, outcome.message);
    assert.equal(scope.children.length, 0, "a child whose session never opened is no child of the scope");
    // The child will never run: its exit is claimed, with its own credential.
    assert.deepEqual(confirmed, [{ node: "n-rogue39k-child", reason: "never ran: its session did not open" }]);
    // And its session is not left open.
    assert.equal(sessions.length, 1);
    assert.ok(sessions[0].closed || sessions[0].destroyed || sessions[0].rstCode !== undefined, "the sub-agent's session stream was left open");
  } finally {
    clearTimeout(guard);
    gate.close().catch(() => {});
    parent.close();
  }
});
