// Seed 000 §1 and §7, read from the document alone, as they reach a user of
// the TypeScript LeaseWorker: a partition must not make two apparent
// owners, and once the lease has expired its former holder has no
// execution authority. The Go SDK (agentsdk/seed_probe_test.go) is the
// reference.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

import { Conn, JobEnded, LeaseWorker } from "../src/index.js";
import { startServer, TestServer } from "./server.js";

let server: TestServer;
const conns: Conn[] = [];

before(async () => {
  server = await startServer();
});
after(async () => {
  for (const c of conns) c.close();
  await server?.stop();
});

/** A worker agent whose connection the test can cut (every call then fails unavailable). */
async function cuttableWorker(name: string, clock: () => number = Date.now) {
  const root = await server.rootAgent(name);
  const spawned = await root.agent.spawn(`${name}-worker`);
  // answeredSince: the worker's clock at the start of the last renewal
  // answered (accepted or not); refused: the calls the cut network refused.
  const net = { cut: false, answeredSince: -Infinity, refused: 0 };
  const cutter: Interceptor = (next) => async (req) => {
    if (net.cut) {
      net.refused++;
      throw new ConnectError("network unreachable (test)", Code.Unavailable);
    }
    const started = clock();
    const res = await next(req);
    if (req.method.name === "Renew") net.answeredSince = Math.max(net.answeredSince, started);
    return res;
  };
  const conn = Conn.dial(server.baseUrl, spawned.credential, {
    transport: (bearer) => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", interceptors: [bearer, cutter] }),
  });
  conns.push(conn);
  return { nodeId: spawned.node!.nodeId, credential: spawned.credential, conn, net };
}

/** Resolves once cond holds, polling; fails after 20 s. */
async function waitFor(what: string, cond: () => boolean) {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(cond(), `timed out waiting for ${what}`);
}

describe("seed probe: a partitioned holder stops by the expiry it was granted", () => {
  test("the job ends when the worker's clock passes its last accepted renewal's send time plus the lease duration", async () => {
    let now = Date.parse("2026-11-30T12:00:00Z"); // the worker's clock, moved by the test
    const w = await cuttableWorker("probe-partition", () => now);
    const jobId = "probe-ts-partition";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: w.nodeId, leaseDuration: { seconds: 30n } });
    // The loop renews on every tick; the tick is also each renewal's
    // deadline, so a guard (a second), not a time a busy machine's answers
    // exceed (100 ms was).
    const job = await new LeaseWorker({ conn: w.conn, now: () => now, renewEveryMs: 1_000 }).accept(offered.lease!);

    // A renewal at 20s (the loop renews on every tick) grants up to 50s on
    // the worker's clock.
    now += 20_000;
    const at20 = now;
    await waitFor("a renewal sent at 20s, answered", () => w.net.answeredSince >= at20);
    w.net.cut = true; // from here on nothing reaches the coordinator
    now += 29_000;
    // Ticks that must not end it: two, each refused by the cut network
    // once its look at the bound let it renew.
    const refused = w.net.refused;
    await waitFor("two ticks at 49s", () => w.net.refused >= refused + 2 || job.signal.aborted);
    assert.equal(job.signal.aborted, false, `the job ended at 49s, within its window: ${String(job.signal.reason)}`);

    now += 1_000; // 50s
    await Promise.race([job.done, new Promise((_, reject) => setTimeout(() => reject(new Error("the partitioned job still runs past its bound")), 20_000))]);
    const reason = job.signal.reason;
    assert.ok(reason instanceof JobEnded && reason.kind === "lost" && /authority cannot be proven/.test(reason.detail), String(reason));
  });

  test("a resumed job (its ACK a DUPLICATE) renews at once, and ends when that renewal gets no answer", async () => {
    const w = await cuttableWorker("probe-resume");
    const jobId = "probe-ts-resume";
    const offered = await server.operator.lease.offer({ jobId, holderIdentity: w.nodeId, leaseDuration: { seconds: 30n } });
    const first = await new LeaseWorker({ conn: w.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    first.stop(); // the process is gone

    const resumed = await new LeaseWorker({ conn: w.conn, renewEveryMs: 60_000 }).accept(offered.lease!);
    assert.equal((await server.operator.lease.getLease({ jobId })).lease?.renewSequence, 1n, "the resumed job renewed at once");
    assert.equal(resumed.signal.aborted, false, String(resumed.signal.reason));
    resumed.stop();

    // A third life whose renewal is cut off after its ACK.
    let acks = 0;
    const once: Interceptor = (next) => async (req) => {
      if (req.method.name !== "Ack" || acks++ > 0) throw new ConnectError("network unreachable (test)", Code.Unavailable);
      return next(req);
    };
    const limited = Conn.dial(server.baseUrl, w.credential, {
      transport: (bearer) => createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", interceptors: [bearer, once] }),
    });
    conns.push(limited);
    const lost = await new LeaseWorker({ conn: limited, renewEveryMs: 60_000 }).accept(offered.lease!);
    assert.equal(lost.lease.leaseGeneration, 1n);
    assert.ok(lost.signal.aborted && lost.signal.reason instanceof JobEnded && lost.signal.reason.kind === "lost", String(lost.signal.reason));
  });
});
