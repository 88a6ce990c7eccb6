// The forty-sixth hostile pass on the TypeScript SDK's LeaseWorker (letter
// C), through a real tether server: a job accepted from an offer that names
// no lease duration (one its caller built by hand from the ids it was
// handed: job, lease, generation) took its window from whatever duration
// each accepted answer named. The forty-fourth pass bounded the answers'
// duration by the offer's and left such an offer to the answers (design
// §11): a rogue path to the control plane (an interceptor on the worker's
// own HTTP/2 path) answers the job's first renewal with the real accepted
// answer and a day's duration in its lease, then withholds everything. The
// job's bound moved a day on: cut off from its coordinator, deaf to a
// cancel request, it worked on past its 30-second lease's expiry for the
// day. The generation's duration is now fixed by the ACK's answer when the
// offer names none, as by the offer when it does (the Go worker's
// TestRogue46CAnOfferWithoutADurationDoesNotTakeAForgedWindow).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { JobEnded, LeaseWorker } from "../src/index.js";
import { LeaseSchema, type RenewResponse } from "../src/gen/tether/v1/lease_pb.js";
import { dialThrough } from "./roguepath.js";
import { startServer, TestServer, within } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue46C: an offer without a duration does not take a forged window", () => {
  test("a forged day in the first renewal's answer, then nothing: the job ends at its 30 s lease on the worker's clock", async () => {
    const root = await server.rootAgent("rogue46c");
    const spawned = await root.agent.spawn("rogue46c-child");
    const jobId = "ts-rogue46c";
    let cut = false;
    let withheld = 0;
    let forged!: () => void;
    const didForge = new Promise<void>((resolve) => (forged = resolve));
    let withholding!: () => void;
    const didWithhold = new Promise<void>((resolve) => (withholding = resolve));
    const path: Interceptor = (next) => async (req) => {
      if (cut) {
        withheld++;
        withholding();
        throw new ConnectError("the path withholds the worker's lease traffic (rogue46C)", Code.Unavailable);
      }
      const res = await next(req);
      if (req.method.name === "Renew" && !res.stream) {
        const lease = (res.message as RenewResponse).lease;
        if (lease?.jobId === jobId) {
          lease.leaseDuration = { ...lease.leaseDuration!, seconds: 86_400n, nanos: 0 };
          cut = true; // the forged answer is the last the job hears
          forged();
        }
      }
      return res;
    };
    const { conn, closeSessions } = dialThrough(server.baseUrl, spawned.credential, path);
    let now = Date.now();
    // Each renewal is given the interval to be answered: long enough for
    // the forged answer to reach the job.
    const worker = new LeaseWorker({ conn, now: () => now, renewEveryMs: 1_000 });
    try {
      const offered = (await server.operator.lease.offer({ jobId, holderIdentity: spawned.node.nodeId, leaseDuration: { seconds: 30n } })).lease!;
      // The worker is handed the ids, not the lease: its caller builds the
      // offer it accepts, with no duration in it.
      const handBuilt = create(LeaseSchema, { jobId: offered.jobId, leaseId: offered.leaseId, leaseGeneration: offered.leaseGeneration });
      const job = await worker.accept(handBuilt);
      // The renew loop's first renewal gets the forged answer (accepted, a
      // day's duration), and its next request is withheld: the loop acted
      // on the forged answer before it sent that one. The worker's clock
      // has not moved since the ACK.
      const ended = job.done.then(() => assert.fail(`the job ended before the forged answer and the next renewal: ${String(job.signal.reason)}`));
      ended.catch(() => {}); // the job ends when the test does: only its end first fails it
      await within(Promise.race([Promise.all([didForge, didWithhold]), ended]), 20_000, "the job's first two renewals");
      assert.ok(job.lease.renewSequence === 1n && job.lease.leaseDuration?.seconds === 86_400n,
        `the forged answer never reached the job (renew seq ${job.lease.renewSequence}): the test proves nothing`);
      // Past the 30-second lease on the worker's clock, with no answer
      // since the forged one: nothing the coordinator accepted covers it.
      now += 31_000;
      // A guard (ten renew ticks), not a timing.
      await within(job.done, 10_000, () => `the job works on 31 s after its last accepted renewal of a 30 s lease (${withheld} request(s) withheld): its bound is the forged day's`);
      const reason = job.signal.reason as JobEnded;
      assert.ok(reason instanceof JobEnded && reason.kind === "lost", String(reason));
    } finally {
      await worker.close();
      conn.close();
      closeSessions();
    }
  });
});
