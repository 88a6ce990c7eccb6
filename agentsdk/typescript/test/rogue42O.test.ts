// The forty-second hostile pass on the TypeScript SDK (letter O), through a
// real tether server: an agent ends a session whose heartbeats go
// unanswered and opens another, as the Go SDK's Agent does since the
// forty-second pass (rogue42j).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Agent, MaxMessageBytes, MaxUnansweredHeartbeats, StopSignalled } from "../src/index.js";
import type { SessionResponse } from "../src/gen/tether/v1/agent_pb.js";
import { startServer, within, type TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

describe("rogue42O: a silent session does not deafen the agent", () => {
  // A hostile element on the agent's path to the control plane (a proxy
  // that stalls the stream, a peer) holds the agent's session open and
  // silent: the agent's heartbeats go out, the control plane's answers
  // (its acknowledgements, the node's signals) never come back. The
  // TypeScript agent waited on that stream for good — deaf to its node's
  // drain once the path was honest again, since it never opened another
  // session. Now a session whose heartbeats go unanswered
  // (MaxUnansweredHeartbeats in a row: the control plane acknowledges
  // each) is ended, Code.Unavailable, and another opened, on which the
  // drain is heard.
  test("a path that relays the session's opened and then nothing", async () => {
    assert.equal(MaxUnansweredHeartbeats, 3);
    // On the first session it relays the control plane's messages up to
    // the opened, then nothing more, holding the stream until the agent
    // ends it; from then on it relays honestly. It counts the sessions the
    // agent opened.
    let sessions = 0;
    const hostile: Interceptor = (next) => async (req) => {
      if (req.method.name !== "Session") return next(req);
      const first = ++sessions === 1;
      const res = await next(req);
      if (!first || !res.stream) return res;
      const real = res.message as AsyncIterable<SessionResponse>;
      const signal = req.signal;
      const messages = async function* () {
        for await (const msg of real) {
          yield msg;
          if (msg.kind.case === "opened") break;
        }
        // Silent until the agent gives up on the stream.
        if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        throw new ConnectError("the path held the session (rogue42O)", Code.Canceled);
      };
      return { ...res, message: messages() } as typeof res;
    };
    const managers: Http2SessionManager[] = [];
    const agent = await Agent.registerRoot(server.operator, "rogue42o", {}, {
      retry: { attempts: 1 },
      transport: (auth) => {
        const sessionManager = new Http2SessionManager(server.baseUrl);
        managers.push(sessionManager);
        return createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", sessionManager, interceptors: [auth, hostile], readMaxBytes: MaxMessageBytes });
      },
    });
    const warns: string[] = [];
    const stop = new AbortController();
    let ended = "";
    const running = agent.run({ signal: stop.signal, heartbeatMs: 50, warn: (m) => warns.push(m) }).then(
      () => (ended = "returned"),
      (err: unknown) => (ended = `threw ${ConnectError.from(err).message}`),
    );
    try {
      await within(agent.opened, 20_000, "the stalled session's opened"); // relayed
      const terminationId = await server.terminate(agent.nodeId, "drain", 3600);
      // A guard against the hang, not a timing: 20 s is 400 heartbeat intervals.
      const heard = await agent.waitForStop(20_000);
      assert.ok(heard, `the agent is deaf: the drain not heard 20 s after it was ordered (400 heartbeat intervals); ${sessions} session(s) opened, the stalled one still waited on; run ${ended || "running"}`);
      assert.ok(sessions >= 2, `the drain heard on ${sessions} session(s): the stalled one relayed it`);
      const reason = agent.drainSignal.reason as StopSignalled | undefined;
      assert.equal(reason?.terminationId, terminationId, `the agent stopped on something other than the operator's drain: ${reason?.message}`);
      assert.equal(agent.signal.aborted, false, "the agent aborted itself");
      assert.equal(ended, "", "run ended");
      assert.ok(
        warns.some((w) => w.includes(`carried nothing back for ${MaxUnansweredHeartbeats} heartbeats`)),
        `no warning says the silent session was ended: ${warns.join(" | ")}`,
      );
    } finally {
      stop.abort();
      await running;
      agent.close();
      for (const m of managers) m.abort();
    }
  });
});
