// The twenty-second hostile pass on the TypeScript SDK:
// - a peer's error that echoes the bearer token (a proxy quoting the
//   request it refused, or a hostile control plane) carried the token, and
//   its signature, into the ConnectError a call threw (message, metadata,
//   details) and into the verifier's warnings;
// - a key set answered with a redirect: the verifier fetched it from
//   wherever the peer's Location said;
// - confirmExit beside an open session claimed the exit by a unary call
//   while the session went on: the heartbeats after the claim contradicted
//   it and the record called a drained agent unaccounted;
// - docs/integrating.md's agent, run as written.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import ts from "typescript";
import { StringValueSchema } from "@bufbuild/protobuf/wkt";
import { Agent, Conn, Verifier } from "../src/index.js";
import { NodeOutcome } from "../src/gen/tether/v1/supervisor_pb.js";
import { Peer, respondStream, envelope, type Handler } from "./peer.js";
import { startServer, type TestServer } from "./server.js";

const token = "eyJhbGciOiJFZERTQSIsImtpZCI6InJvZ3VlIn0.eyJzdWIiOiJyb2d1ZTIyIn0.c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw";
const signature = "c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw";

const here = dirname(fileURLToPath(import.meta.url));
// dist/test -> agentsdk/typescript -> repository root
const repoRoot = resolve(here, "..", "..", "..", "..");

const stops: (() => unknown)[] = [];
let server: TestServer | undefined;
after(async () => {
  for (const s of stops.reverse()) await s();
  await server?.stop();
});

/** What a peer sent as the bearer token. */
function sent(headers: http2.IncomingHttpHeaders | http.IncomingHttpHeaders): string {
  return String(headers.authorization ?? "").replace(/^Bearer /, "");
}

/** A Connect error (JSON) quoting the token whole in its message, and its signature in a detail. */
function echoedError(presented: string): { code: string; message: string; details: { type: string; value: string }[] } {
  const sig = presented.slice(presented.lastIndexOf(".") + 1);
  const detail = toBinary(StringValueSchema, create(StringValueSchema, { value: `you sent ${sig}` }));
  return {
    code: "permission_denied",
    message: `refused Authorization: Bearer ${presented} (signature ${sig})`,
    details: [{ type: "google.protobuf.StringValue", value: Buffer.from(detail).toString("base64").replace(/=+$/, "") }],
  };
}

const echo: Handler = (stream, headers) => {
  const presented = sent(headers);
  const sig = presented.slice(presented.lastIndexOf(".") + 1);
  if (String(headers[":path"]).endsWith("/WatchCancels") || String(headers[":path"]).endsWith("/WatchRevocations")) {
    stream.respond({ ":status": 200, "content-type": "application/connect+proto", "x-echo": `token=${presented}` });
    stream.end(envelope(2, Buffer.from(JSON.stringify({ error: echoedError(presented), metadata: { "x-sig": [sig] } }))));
    return;
  }
  stream.respond({ ":status": 403, "content-type": "application/json", "x-echo": `token=${presented}`, "x-sig": sig });
  stream.end(JSON.stringify(echoedError(presented)));
};

/** Where err (a ConnectError's message, metadata, details or cause) still carries the token or its signature. */
function holdsSecret(err: unknown): string {
  const has = (s: string) => s.includes(token) || s.includes(signature);
  for (let e: unknown = err; e !== undefined && e !== null; e = (e as { cause?: unknown }).cause) {
    if (e instanceof Error && has(e.message)) return `message: ${e.message}`;
    if (!(e instanceof Error)) return has(String(e)) ? `cause: ${String(e)}` : "";
  }
  if (err instanceof ConnectError) {
    for (const [k, v] of err.metadata) if (has(k) || has(v)) return `metadata ${k}: ${v}`;
    for (const d of err.details) {
      const bytes = "value" in d && d.value instanceof Uint8Array ? Buffer.from(d.value).toString("latin1") : JSON.stringify(d);
      if (has(bytes)) return `detail ${"type" in d ? d.type : ""}`;
    }
  }
  return "";
}

/**
 * A server on one loopback port that speaks HTTP/2 (h2c, the Conn's
 * calls) to a client that opens with the HTTP/2 preface and HTTP/1.1 (the
 * verifier's fetch of the key set) to any other.
 */
async function mixedPeer(h2: Record<string, Handler>, h1: http.RequestListener): Promise<string> {
  const peer = new Peer(h2);
  const plain = http.createServer(h1);
  const front = net.createServer((socket) => {
    socket.once("data", (first) => {
      socket.pause();
      socket.unshift(first);
      (first.toString("latin1").startsWith("PRI * HTTP/2.0") ? peer.server : plain).emit("connection", socket);
      socket.resume();
    });
  });
  front.listen(0, "127.0.0.1");
  await once(front, "listening");
  stops.push(() => new Promise<void>((resolve) => front.close(() => resolve())));
  stops.push(() => plain.closeAllConnections());
  stops.push(() => peer.stop());
  return `http://127.0.0.1:${(front.address() as net.AddressInfo).port}`;
}

describe("rogue22: a peer's error that echoes the bearer token", () => {
  test("a unary call's and a stream's ConnectError carry neither the token nor its signature, and keep their code", async () => {
    const peer = new Peer({ WhoAmI: echo, WatchCancels: echo });
    await peer.start();
    stops.push(() => peer.stop());
    const conn = Conn.dial(peer.url, token);
    stops.push(() => conn.close());

    const unaryErr = await conn.auth.whoAmI({}).then(() => undefined, (e: unknown) => e);
    assert.ok(unaryErr instanceof ConnectError && unaryErr.code === Code.PermissionDenied, `whoAmI: ${String(unaryErr)}`);
    assert.equal(holdsSecret(unaryErr), "", "a unary call's error carries the token or its signature");
    assert.match(unaryErr.message, /\[bearer token\]/, "the message says what was cut");

    let streamErr: unknown;
    try {
      for await (const _ of conn.tool.watchCancels({ gateId: "ts-rogue22" })) void _;
    } catch (e) {
      streamErr = e;
    }
    assert.ok(streamErr instanceof ConnectError && streamErr.code === Code.PermissionDenied, `watchCancels: ${String(streamErr)}`);
    assert.equal(holdsSecret(streamErr), "", "a stream's error carries the token or its signature");
  });

  test("the verifier's warnings carry neither: a key set naming a key by the token, a feed's error echoing it", async () => {
    const url = await mixedPeer({ WatchRevocations: echo }, (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ keys: [{ kty: "OKP", crv: "Ed25519", kid: token, x: "not-a-key" }] }));
    });
    const conn = Conn.dial(url, token);
    stops.push(() => conn.close());
    const warnings: string[] = [];
    const stop = new AbortController();
    const verifier = new Verifier({
      conn,
      warn: (m) => {
        warnings.push(m);
        if (warnings.some((w) => w.includes("key set")) && warnings.some((w) => w.includes("revocation feed"))) stop.abort();
      },
    });
    await verifier.run(stop.signal);
    for (const w of warnings) assert.ok(!w.includes(token) && !w.includes(signature), `the verifier warned with the token or its signature: ${w}`);
  });
});

describe("rogue22: redirects", () => {
  test("the verifier fetches no key set from where a redirect points, and the Conn follows none", async () => {
    let hits = 0;
    const target = http.createServer((_req, res) => {
      hits++;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ keys: [] }));
    });
    target.listen(0, "127.0.0.1");
    await once(target, "listening");
    stops.push(() => new Promise<void>((resolve) => target.close(() => resolve())));
    stops.push(() => target.closeAllConnections());
    const elsewhere = `http://127.0.0.1:${(target.address() as net.AddressInfo).port}`;

    for (const status of [307, 308]) {
      const redirect = (path: string) => ({ ":status": status, location: elsewhere + path });
      const url = await mixedPeer(
        {
          WhoAmI: (stream, headers) => {
            stream.respond(redirect(String(headers[":path"])));
            stream.end();
          },
        },
        (req, res) => {
          res.writeHead(status, { location: elsewhere + req.url });
          res.end();
        },
      );
      const conn = Conn.dial(url, token);
      stops.push(() => conn.close());
      await assert.rejects(conn.auth.whoAmI({}), ConnectError, `a ${status} of a call was followed`);

      const warnings: string[] = [];
      const stop = new AbortController();
      const verifier = new Verifier({ conn, warn: (m) => (warnings.push(m), stop.abort()) });
      await verifier.run(stop.signal);
      // run fetches the key set before it follows the feed: its first
      // warning is about the key set unless the fetch succeeded.
      assert.match(warnings[0] ?? "", /key set.*redirect/, `a ${status} of the key set: ${warnings[0]}`);
    }
    assert.equal(hits, 0, "the redirects' target was asked");
  });
});

describe("rogue22: confirmExit beside an open session", () => {
  before(async () => {
    server = await startServer();
  });

  test("a drained agent that confirms its exit while its session is open is recorded confirmed", async () => {
    const root = await server!.rootAgent("ts-rogue22-root");
    const spawned = await root.agent.spawn("ts-rogue22-child");
    const child = await Agent.join(server!.baseUrl, spawned.credential);
    stops.push(() => child.close());
    const stopChild = new AbortController();
    const childSession = child.run({ signal: stopChild.signal, heartbeatMs: 100 });
    stops.push(async () => {
      stopChild.abort();
      await childSession.catch(() => {});
    });
    await child.opened;

    const terminationId = await server!.terminate(root.agent.nodeId, "drain");
    await new Promise<void>((resolve) => {
      if (child.drainSignal.aborted) return resolve();
      child.drainSignal.addEventListener("abort", () => resolve(), { once: true });
    });
    // Both sessions are open: the child's run and the root's.
    await child.confirmExit("drained");
    await root.agent.confirmExit("drained");
    const record = await server!.record(terminationId);
    const outcomes = Object.fromEntries(record.nodes.map((n) => [n.name, NodeOutcome[n.outcome]]));
    assert.deepEqual(outcomes, { "ts-rogue22-root": "CONFIRMED", "ts-rogue22-child": "CONFIRMED" });
    // The session's loop ended with the claim: it does not reopen.
    await childSession;
  });

  test("docs/integrating.md's agent runs as written: drained mid-loop, its exit is recorded confirmed", async () => {
    // Only its address is the test server's; the search it calls is
    // answered in its process (no network here), and a wrapper exits the
    // process once the snippet is done (its agent's connection stays open).
    const doc = readFileSync(join(repoRoot, "docs", "integrating.md"), "utf8");
    const section = doc.slice(doc.indexOf("## In TypeScript"));
    const start = section.indexOf("```ts\n") + "```ts\n".length;
    const code = section.slice(start, section.indexOf("```", start)).replaceAll("http://127.0.0.1:7420", server!.baseUrl);
    const compiled = ts.transpileModule(code, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
    // Inside the package, so that "@tetherhq/agentsdk" resolves to it.
    const dir = mkdtempSync(join(here, "doc-agent-"));
    stops.push(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "agent.mjs"), compiled);
    writeFileSync(
      join(dir, "run.mjs"),
      `const real = globalThis.fetch;
globalThis.fetch = async (url, init) => {
  if (String(url).startsWith("https://search.example/")) { process.stdout.write("searched\\n"); return new Response("results"); }
  return real(url, init);
};
await import("./agent.mjs");
process.exit(0);
`,
    );

    const root = await server!.rootAgent("ts-doc-planner");
    const spawned = await root.agent.spawn("ts-doc-agent");
    const grant = await root.agent.delegate(root.grant.grant.grantId, spawned.node!.nodeId, ["tool:search"], 600_000);
    const tool = await server!.operator.auth.createToken({ toolServer: "search-gate", ttl: { seconds: 3600n } });
    const child = spawn(process.execPath, [join(dir, "run.mjs")], {
      env: { ...process.env, TETHER_CREDENTIAL: spawned.credential, TETHER_GRANT_ID: grant.grant.grantId, TETHER_TOOL_TOKEN: tool.token },
      stdio: ["ignore", "pipe", "pipe"],
    });
    stops.push(() => void child.kill());
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const exited = once(child, "exit");
    await new Promise<void>((resolve, reject) => {
      child.stdout.on("data", (d: Buffer) => d.toString().includes("searched") && resolve());
      void exited.then(() => reject(new Error(`the doc's agent exited before it searched: ${stderr}`)));
    });

    const terminationId = await server!.terminate(root.agent.nodeId, "drain");
    const [exitCode] = await exited;
    assert.equal(exitCode, 0, `the doc's agent: ${stderr}`);
    await root.agent.confirmExit("drained");
    const record = await server!.record(terminationId);
    const outcomes = Object.fromEntries(record.nodes.map((n) => [n.name, NodeOutcome[n.outcome]]));
    assert.deepEqual(outcomes, { "ts-doc-planner": "CONFIRMED", "ts-doc-agent": "CONFIRMED" });
  });
});
