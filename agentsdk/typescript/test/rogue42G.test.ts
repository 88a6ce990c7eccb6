// The forty-second hostile pass on the TypeScript SDK (letter G), through a
// real tether server: an agent takes the refreshed credential an answer
// carries only when it has a credential's shape, as the Go SDK's Agent
// (rogue41I) and the Python one (rogue41G) do since the forty-first pass.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { Agent, compactJWS, MaxMessageBytes, MaxTokenBytes, StopSignalled } from "../src/index.js";
import { NodeSchema, SessionCredentialSchema, SessionResponseSchema, type HeartbeatResponse, type SessionResponse } from "../src/gen/tether/v1/agent_pb.js";
import { startServer, within, type TestServer } from "./server.js";

let server: TestServer;

before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

/** Resolves once cond() holds, checked every 20 ms; rejects after ms (a guard against a hang, not a timing). */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  for (let waited = 0; !cond(); waited += 20) {
    if (waited >= ms) throw new Error(`${what} did not happen within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/**
 * An interceptor that, once injected() holds, records in after each
 * session the agent tries: "pending", then "opened" or the code it ended
 * with.
 */
function sessionsAfter(injected: () => boolean, after: string[]): Interceptor {
  return (next) => async (req) => {
    if (!injected() || req.method.name !== "Session") return next(req);
    const i = after.push("pending") - 1;
    try {
      const res = await next(req);
      after[i] = "opened";
      return res;
    } catch (err) {
      after[i] = Code[ConnectError.from(err).code];
      throw err;
    }
  };
}

/**
 * Registers a root agent called name whose calls pass counter, then the
 * SDK's own interceptor, then hostile, one attempt each; sessions are its
 * HTTP/2 session managers, for the test to abort.
 */
async function registerOnPath(name: string, counter: Interceptor, hostile: Interceptor): Promise<{ agent: Agent; sessions: Http2SessionManager[] }> {
  const sessions: Http2SessionManager[] = [];
  const agent = await Agent.registerRoot(server.operator, name, {}, {
    retry: { attempts: 1 },
    transport: (auth) => {
      const sessionManager = new Http2SessionManager(server.baseUrl);
      sessions.push(sessionManager);
      return createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "2", sessionManager, interceptors: [counter, auth, hostile], readMaxBytes: MaxMessageBytes });
    },
  });
  return { agent, sessions };
}

// The credentials a hostile element on the path hands the agent, each
// made from its own (so that only its shape is wrong).
const bad: [string, (own: string) => string][] = [
  ["with a space", (own) => own.replace(".", " .")],
  ["with a line break", (own) => `${own}\r\nX-Rogue: 1`],
  ["past the control plane's 64 KiB of headers", () => "a".repeat(80 << 10)],
  ["of a JWS's shape past MaxTokenBytes", (own) => `${"A".repeat(MaxTokenBytes)}${own}`],
];

// Where the hostile element puts it: a session's credential message (the
// session then broken, so that the agent reconnects on what it took), or
// the answer of the unary heartbeat the agent sends in place of a session
// the element refused resource_exhausted.
const paths = ["session", "heartbeat"] as const;

describe("rogue42G: a refreshed credential the agent cannot present does not deafen or abort it", () => {
  const cases: [string, (own: string) => string, (typeof paths)[number]][] = [];
  for (const path of paths) for (const [what, make] of bad) cases.push([what, make, path]);
  // A session's credential message is taken as it is, an empty one too.
  cases.push(["that is empty", () => "", "session"]);

  for (const [what, make, path] of cases) {
    test(`a credential ${what} in a ${path}'s answer`, async () => {
      // An element on the agent's path (a proxy's, a hostile peer's): it
      // hands the agent the bad credential once, by path; it counts the
      // sessions the agent tries after that (the outermost interceptor,
      // before the SDK's own refuses to send a token) and how they ended.
      let injected = false;
      let credential = "";
      const after: string[] = [];
      const counter = sessionsAfter(() => injected, after);
      const hostile: Interceptor = (next) => async (req) => {
        if (injected) return next(req);
        if (req.method.name === "Session") {
          if (path === "heartbeat") throw new ConnectError("the path's own bound (rogue42G)", Code.ResourceExhausted);
          const res = await next(req);
          if (!res.stream) return res;
          injected = true;
          const real = res.message as AsyncIterable<SessionResponse>;
          const messages = async function* () {
            // The session opens (the agent is reachable) before the
            // credential comes.
            for await (const msg of real) {
              yield msg;
              if (msg.kind.case === "opened") break;
            }
            yield create(SessionResponseSchema, { kind: { case: "credential", value: { credential } } }) as SessionResponse;
            throw new ConnectError("the path broke the session (rogue42G)", Code.Unavailable);
          };
          return { ...res, message: messages() } as typeof res;
        }
        if (req.method.name === "Heartbeat") {
          const res = await next(req);
          if (res.stream) return res;
          (res.message as HeartbeatResponse).credential = create(SessionCredentialSchema, { credential });
          injected = true;
          return res;
        }
        return next(req);
      };
      const { agent, sessions } = await registerOnPath(`rogue42g-${path}`, counter, hostile);
      const own = agent.credential;
      credential = make(own);
      assert.ok(!compactJWS(credential), "the hostile credential has a credential's shape");
      const warns: string[] = [];
      const stop = new AbortController();
      let ended = "";
      const running = agent.run({ signal: stop.signal, heartbeatMs: 200, warn: (m) => warns.push(m) }).then(
        () => (ended = "returned"),
        (err: unknown) => (ended = `threw ${ConnectError.from(err).message}`),
      );
      try {
        await until(() => injected || ended !== "", 20_000, "the hostile answer");
        // A session the agent tried after the answer has ended: opened on
        // its own credential (now), or refused (before).
        await until(() => after.some((a) => a !== "pending") || ended !== "", 20_000, "a session after the hostile answer");
        const terminationId = await server.terminate(agent.nodeId, "drain");
        const heard = await within(agent.waitForStop(20_000), 25_000, "the drain");
        const reason = agent.drainSignal.reason as StopSignalled | undefined;
        assert.equal(agent.signal.aborted, false, `the agent aborted itself (${(agent.signal.reason as Error)?.message}); sessions after the answer: ${after.join(", ")}`);
        assert.ok(heard, `the operator's drain was not heard; sessions after the answer: ${after.join(", ")}; run ${ended || "running"}`);
        assert.equal(reason?.terminationId, terminationId, `the agent stopped on something other than the operator's drain: ${reason?.message}`);
        assert.equal(ended, "", "run ended");
        assert.equal(agent.credential, own, "the agent's credential was replaced");
        for (const w of warns) assert.ok(credential === "" || !w.includes(credential), "a warning quotes the hostile credential");
        if (credential !== "") assert.ok(warns.some((w) => w.includes("keeps its own")), `no warning says the credential was not taken: ${warns.join(" | ")}`);
      } finally {
        stop.abort();
        await running;
        agent.close();
        for (const s of sessions) s.abort();
      }
    });
  }
});

// The session's opened message carries the node as the control plane
// stored it. The TypeScript agent took it whole, its id too, and asked as
// that node from then on (its next session's hello, its heartbeats, its
// exit claim), where the Go SDK's Agent keeps the id it was made with and
// the Python one takes the node only when it names itself (rogue40H): an
// element on the path that named another node in it (the agent's parent,
// a sibling), or none (a node without an id), had the agent's next session
// refused permission_denied as that node, and the agent abort itself on the
// refusal, a stop nobody ordered.
describe("rogue42G: an opened message naming another node does not change who the agent is", () => {
  for (const what of ["another node", "no node id"] as const) {
    test(`an opened message naming ${what}`, async () => {
      const other = what === "another node" ? (await Agent.registerRoot(server.operator, "rogue42g-other")).node : create(NodeSchema, { name: "rogue42g-nobody" });
      let injected = false;
      const after: string[] = [];
      const counter = sessionsAfter(() => injected, after);
      const hostile: Interceptor = (next) => async (req) => {
        if (injected || req.method.name !== "Session") return next(req);
        const res = await next(req);
        if (!res.stream) return res;
        injected = true;
        const real = res.message as AsyncIterable<SessionResponse>;
        const messages = async function* () {
          for await (const msg of real) {
            if (msg.kind.case === "opened") {
              yield create(SessionResponseSchema, { kind: { case: "opened", value: { node: other } } }) as SessionResponse;
              break;
            }
            yield msg;
          }
          throw new ConnectError("the path broke the session (rogue42G)", Code.Unavailable);
        };
        return { ...res, message: messages() } as typeof res;
      };
      const { agent, sessions } = await registerOnPath("rogue42g-opened", counter, hostile);
      const id = agent.nodeId;
      const stop = new AbortController();
      let ended = "";
      const running = agent.run({ signal: stop.signal, heartbeatMs: 200 }).then(
        () => (ended = "returned"),
        (err: unknown) => (ended = `threw ${ConnectError.from(err).message}`),
      );
      try {
        await until(() => injected || ended !== "", 20_000, "the hostile opened message");
        await until(() => after.some((a) => a !== "pending") || ended !== "", 20_000, "a session after the hostile opened message");
        const terminationId = await server.terminate(id, "drain");
        const heard = await within(agent.waitForStop(20_000), 25_000, "the drain");
        const reason = agent.drainSignal.reason as StopSignalled | undefined;
        assert.equal(agent.signal.aborted, false, `the agent aborted itself (${(agent.signal.reason as Error)?.message}); sessions after the message: ${after.join(", ")}`);
        assert.ok(heard, `the operator's drain was not heard; sessions after the message: ${after.join(", ")}; run ${ended || "running"}`);
        assert.equal(reason?.terminationId, terminationId, `the agent stopped on something other than the operator's drain: ${reason?.message}`);
        assert.equal(agent.nodeId, id, "the agent's node id changed");
        assert.equal(agent.node.nodeId, id, "the agent's node is another's");
      } finally {
        stop.abort();
        await running;
        agent.close();
        for (const s of sessions) s.abort();
      }
    });
  }
});
