// The twenty-sixth hostile pass on the TypeScript SDK, through a real tether
// server: what the SDK does when the control plane says no to an agent.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

import { Agent, JobEnded, LeaseWorker, MaxMessageBytes, StopSignalled, TetherScope } from "../src/index.js";
import { NodeOutcome } from "../src/gen/tether/v1/supervisor_pb.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue26: an agent whose exit was confirmed while it was cut off", () => {
  // A launcher attests the agent's exit (ConfirmExit with an operator
  // token) while its process is in fact still there, cut off from the
  // control plane. The control plane refuses the agent's every session from
  // then on (failed_precondition, each kept as evidence contradicting the
  // exit); its signal for such a node is "stop now", but the refusal comes
  // before it. run() took the refusal for a passing fault and reconnected
  // for ever, and agent.signal never aborted: the agent's work went on.
  test("is told to stop, and run() ends with the refusal", async () => {
    const root = await server.rootAgent("rogue26-attested");
    const spawned = await root.agent.spawn("rogue26-attested-child");
    const me = await Agent.join(server.baseUrl, spawned.credential);
    try {
      await server.operator.agent.confirmExit({ nodeId: spawned.node.nodeId, reason: "its process is gone" });
      const warnings: string[] = [];
      const stop = new AbortController();
      const ran = me.run({ signal: stop.signal, heartbeatMs: 200, warn: (m) => warnings.push(m) });
      try {
        const err = await within(
          ran.then(
            () => undefined,
            (e: unknown) => e,
          ),
          10_000,
          () => `run() did not end (it tried again ${warnings.length} times)`,
        );
        assert.ok(err instanceof ConnectError && err.code === Code.FailedPrecondition, `run() ended with ${String(err)}`);
        assert.ok(me.signal.aborted, "the agent's work was not told to stop");
        assert.ok(me.signal.reason instanceof StopSignalled && me.signal.reason.abort, String(me.signal.reason));
        assert.match(me.signal.reason.reason, /exit was confirmed/);
      } finally {
        stop.abort();
        await ran.catch(() => {});
      }
    } finally {
      me.close();
    }
  });
});

describe("rogue26: a sub-agent whose subtree is terminated as it joins", () => {
  // TetherScope.child (an adapter's handoff or subgraph) spawns the child,
  // delegates it a grant, joins it and waits for its session to open. A
  // subtree terminated in between (an abort of the run's agent) has the
  // child's session refused (unauthenticated: its node is terminated): the
  // session loop ends, the child's abort fires, and the session never opens.
  // child() waited for that opening without end, so the handoff, and the
  // framework's run behind it, hung after the stop instead of ending.
  test("child() ends with the refusal, not a wait for a session that will never open", async () => {
    const root = await server.rootAgent("rogue26-handoff");
    const gate = await server.gate("rogue26-handoff-gate");
    let terminated = false;
    // Before the child's first session goes out, its whole subtree is
    // aborted and the termination waited out: the stop lands between the
    // join and the session, deterministically.
    const stopFirst: Interceptor = (next) => async (req) => {
      if (req.method.name === "Session" && !terminated) {
        terminated = true;
        await server.record(await server.terminate(root.agent.nodeId, "abort", 1));
      }
      return next(req);
    };
    const dial = {
      transport: (bearer: Interceptor) =>
        createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", interceptors: [bearer, stopFirst], readMaxBytes: MaxMessageBytes }),
    };
    const scope = new TetherScope(root.agent, gate, root.agent.capabilityToken(root.grant), undefined, dial);
    const err = await within(
      scope.child("rogue26-sub-agent", { scopes: ["tool:search"] }).then(
        (child) => {
          void child.close();
          return undefined;
        },
        (e: unknown) => e,
      ),
      30_000,
      () => `child() did not end (subtree terminated: ${terminated})`,
    );
    assert.ok(terminated, "the subtree was not terminated between the join and the session");
    assert.ok(err instanceof ConnectError && err.code === Code.Unauthenticated, `child() ended with ${String(err)}`);
  });
});

describe("rogue26: a sub-agent refused its grant", () => {
  // TetherScope.child spawns the child, then delegates it its grant: a
  // delegation the control plane refuses (scopes the run's grant does not
  // cover) left the child node behind, never run, with nobody to confirm its
  // exit, and the next termination's record counted it unaccounted: an
  // honest run's sub-agent read as a rogue.
  test("child() ends the child it spawned, so the record accounts for it", async () => {
    const root = await server.rootAgent("rogue26-ungranted");
    const gate = await server.gate("rogue26-ungranted-gate");
    const scope = new TetherScope(root.agent, gate, root.agent.capabilityToken(root.grant));
    const err = await scope.child("rogue26-ungranted-child", { scopes: ["mcp:fs/*"] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.ok(err instanceof ConnectError && err.code === Code.PermissionDenied, `child() ended with ${String(err)}`);
    const terminationId = await server.terminate(root.agent.nodeId, "drain", 30);
    await root.agent.confirmExit("drained");
    const record = await server.record(terminationId);
    const outcomes = Object.fromEntries(record.nodes.map((n) => [n.name, `${NodeOutcome[n.outcome]} ${n.unaccountedReason}`]));
    for (const [name, outcome] of Object.entries(outcomes)) assert.match(outcome, /^CONFIRMED/, `${name}: ${outcome} (${JSON.stringify(outcomes)})`);
  });
});

describe("rogue26: a lease job whose agent's exit was confirmed", () => {
  // The same attested exit, seen by the agent's LeaseWorker rather than its
  // session: the control plane refuses the job's every renewal
  // (failed_precondition: the node's exit was confirmed; a lease's own
  // refusals are decisions, not errors) and keeps each as evidence against
  // the exit. The renew loop warned and renewed again until the job's
  // window lapsed on the worker's clock (a lease's duration), and the job's
  // signal never aborted: its work went on.
  test("is told to stop at the first refused renewal", async () => {
    const root = await server.rootAgent("rogue26-attested-lease");
    const spawned = await root.agent.spawn("rogue26-attested-worker");
    const me = await Agent.join(server.baseUrl, spawned.credential);
    // The loop's tick is also each renewal's deadline: a second is a guard
    // against an answer that never comes, where 50 ms was shorter than a
    // loaded machine's answers, every renewal failing deadline_exceeded.
    const worker = new LeaseWorker({ conn: me.conn, renewEveryMs: 1_000, warn: () => {} });
    try {
      const offered = await server.operator.lease.offer({ jobId: "rogue26-attested-job", holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 600n } });
      const job = await worker.accept(offered.lease!);
      await server.operator.agent.confirmExit({ nodeId: spawned.node.nodeId, reason: "its process is gone" });
      const aborted = new Promise<void>((resolve) => {
        if (job.signal.aborted) resolve();
        job.signal.addEventListener("abort", () => resolve(), { once: true });
      });
      await within(aborted, 10_000, () => "the job was not told to stop after its agent's exit was confirmed (its renewals refused, each kept as evidence against the exit)");
      const reason = job.signal.reason;
      assert.ok(reason instanceof JobEnded && reason.kind === "ended" && /exit was confirmed/.test(reason.detail), String(reason));
    } finally {
      await worker.close();
      me.close();
    }
  });
});

describe("rogue26: a sub-agent whose join failed", () => {
  // TetherScope.child spawns the child, delegates it its grant, then joins
  // it: a join that failed for a transport reason (the network cut for a
  // moment; here the child's first WhoAmI fails unavailable) rejected with
  // the child node spawned and granted left behind, never run, with nobody
  // to confirm its exit: the next termination's record counted the honest
  // run's sub-agent unaccounted.
  test("child() ends the child it spawned, so the record accounts for it", async () => {
    const root = await server.rootAgent("rogue26-unjoined");
    const gate = await server.gate("rogue26-unjoined-gate");
    let cut = false;
    const cutOnce: Interceptor = (next) => async (req) => {
      if (req.method.name === "WhoAmI" && !cut) {
        cut = true;
        throw new ConnectError("network unreachable (test)", Code.Unavailable);
      }
      return next(req);
    };
    const dial = {
      transport: (bearer: Interceptor) =>
        createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", interceptors: [bearer, cutOnce], readMaxBytes: MaxMessageBytes }),
    };
    const scope = new TetherScope(root.agent, gate, root.agent.capabilityToken(root.grant), undefined, dial);
    const err = await scope.child("rogue26-unjoined-child", { scopes: ["tool:search"] }).then(
      (child) => {
        void child.close();
        return undefined;
      },
      (e: unknown) => e,
    );
    assert.ok(cut, "the child's join was not cut");
    assert.ok(err instanceof ConnectError && err.code === Code.Unavailable, `child() ended with ${String(err)}`);
    const terminationId = await server.terminate(root.agent.nodeId, "drain", 30);
    await root.agent.confirmExit("drained");
    const record = await server.record(terminationId);
    const outcomes = Object.fromEntries(record.nodes.map((n) => [n.name, `${NodeOutcome[n.outcome]} ${n.unaccountedReason}`]));
    assert.ok("rogue26-unjoined-child" in outcomes, JSON.stringify(outcomes));
    for (const [name, outcome] of Object.entries(outcomes)) assert.match(outcome, /^CONFIRMED/, `${name}: ${outcome} (${JSON.stringify(outcomes)})`);
  });
});
