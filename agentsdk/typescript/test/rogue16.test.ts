// The sixteenth hostile pass on job leases (seed 000 §7, §9, §12), for the
// TypeScript SDK's Fence, through the real server: a fenced tool server's
// asks were charged to its budget for the job a side effect named, so a
// rogue caller naming another agent's job with a generation nobody was
// issued spent that job's reads, and the real holder's side effects were
// refused until the budget refilled. Now the fence names the generation it
// judges, and a read that does not admit it is charged to the tool server's
// refusals, as the Go and Python SDKs'. The server's budgets are 5 requests
// a second in bursts of 10: the rogue floods until its asks are refused, and
// the holder's side effect follows at once.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, Fence, issuedGenerations, LeaseWorker, UnissuedGeneration, type Conn } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

let server: TestServer;
let holder: Agent;
let tool: Conn;
const stops: (() => void)[] = [];

before(async () => {
  server = await startServer("--rate-limit", "5");
  holder = await Agent.registerRoot(server.operator, "rogue16-holder");
  stops.push(() => holder.close());
  const token = await server.operator.auth.createToken({ toolServer: "rogue16-fenced-tool-ts", ttl: { seconds: 3600n } });
  tool = server.dial(token.token);
});
after(async () => {
  stops.forEach((s) => s());
  await server?.stop();
});

describe("rogue16: a rogue naming another agent's job at a fence", () => {
  test("an unissued generation's asks do not spend the holder's", async () => {
    const offered = await server.operator.lease.offer({ jobId: "ts-rogue16-frozen", holderIdentity: holder.nodeId, leaseDuration: { seconds: 300n } });
    const worker = new LeaseWorker({ conn: holder.conn, renewEveryMs: 600_000 });
    const job = await worker.accept(offered.lease!);
    stops.push(() => job.stop());
    const fence = new Fence({ check: issuedGenerations(tool) });
    const headers = new Headers(job.headers());
    await fence.admitHeaders(headers);

    const generation = offered.lease!.leaseGeneration;
    let refused: unknown;
    for (let i = 0; i < 200 && refused === undefined; i++) {
      const err = await fence.admit("ts-rogue16-frozen", generation + 1n).then(
        () => new Error("an unissued generation was admitted"),
        (e: unknown) => e,
      );
      if (!(err instanceof UnissuedGeneration)) refused = err;
    }
    assert.ok(refused !== undefined, "the rogue's asks were never refused; the probe tests nothing");
    assert.match(String(refused), /rate limit/);
    await fence.admitHeaders(headers); // the holder's side effect, at once
    assert.match(String(refused), /requests refused/);
  });
});
