// A real Tether server for the tests: the binary from $TETHER_BIN, or built
// once per test process with `go build` from this repository, serving on a
// free loopback port with a fresh data directory.
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before } from "node:test";
import { promisify } from "node:util";

import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Agent, Conn, TetherScope, ToolGate, type Grant, type TokenSource, type ToolCall, type ToolGateOptions } from "../src/index.js";
import { TerminationMode } from "../src/gen/tether/v1/proposal_pb.js";
import { TerminationState, type ReconciliationRecord } from "../src/gen/tether/v1/supervisor_pb.js";

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
// dist/test -> agentsdk/typescript -> repository root
const repoRoot = resolve(here, "..", "..", "..", "..");

/**
 * Starts a server before the file's tests, hands it to got, and stops it
 * after them.
 */
export function serveTests(got: (server: TestServer) => void): void {
  let server: TestServer | undefined;
  before(async () => {
    server = await startServer();
    got(server);
  });
  after(async () => {
    await server?.stop();
  });
}

let built: Promise<string> | undefined;

/** The tether binary: $TETHER_BIN, or built into a temporary directory once. */
export function tetherBinary(): Promise<string> {
  if (process.env.TETHER_BIN) return Promise.resolve(resolve(process.env.TETHER_BIN));
  built ??= (async () => {
    const out = join(mkdtempSync(join(tmpdir(), "tether-ts-bin-")), "tether");
    await run("go", ["build", "-o", out, "./cmd/tether"], { cwd: repoRoot });
    return out;
  })();
  return built;
}

/**
 * A loopback port for a `tether serve` to bind, free a moment ago. A port
 * from a listen on port 0 lies in the kernel's ephemeral range; once
 * released it is the kernel's to hand to any listen on port 0 or outgoing
 * connection (this process's clients and peers, any other process's)
 * before the server binds it, which then exits "address already in use".
 * Ports are picked at random below that range where there is room, as the
 * Go tests' are (internal/freeport).
 */
export async function freePort(): Promise<number> {
  const low = ephemeralLow();
  if (low > portFloor) {
    for (let i = 0; i < 64; i++) {
      const port = await listenOn(portFloor + Math.floor(Math.random() * (low - portFloor)));
      if (port !== undefined) return port;
    }
  }
  const port = await listenOn(0);
  if (port === undefined) throw new Error("no free loopback port");
  return port;
}

/** Listens on port of the loopback and lets go: the port bound, or undefined when it was taken. */
async function listenOn(port: number): Promise<number | undefined> {
  const srv = createServer();
  try {
    await new Promise<void>((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(port, "127.0.0.1", () => resolve());
    });
  } catch {
    return undefined;
  }
  const bound = (srv.address() as { port: number }).port;
  srv.close();
  await once(srv, "close");
  return bound;
}

/** The lowest port freePort picks. */
export const portFloor = 10000;

/** The first port of the kernel's ephemeral range (Linux), or 0 when it cannot be read. */
export function ephemeralLow(): number {
  try {
    const [low, high] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
    return Number.isInteger(low) && Number.isInteger(high) ? low : 0;
  } catch {
    return 0;
  }
}

export class TestServer {
  readonly operator: Conn;
  #conns: Conn[] = [];
  #cleanups: (() => Promise<void>)[] = [];
  constructor(
    readonly bin: string,
    readonly baseUrl: string,
    readonly dataDir: string,
    readonly adminToken: string,
    readonly process: ChildProcess,
  ) {
    this.operator = this.dial(adminToken);
  }

  /**
   * A connection that stop() closes. It retries nothing: a test sees every
   * answer the server gives, a rate limit's refusal included (the Go test
   * server's clients too).
   */
  dial(token: string): Conn {
    const c = Conn.dial(this.baseUrl, token, { retry: { attempts: 1 } });
    this.#conns.push(c);
    return c;
  }

  /** Runs the CLI against this server with the admin token. */
  async cli(...args: string[]): Promise<string> {
    const { stdout } = await run(this.bin, ["--addr", this.baseUrl, "--data-dir", this.dataDir, ...args]);
    return stdout;
  }

  /**
   * A root agent with its session running and a root grant; the returned
   * agent is closed by stop().
   */
  async rootAgent(name: string, scopes: string[] = ["tool:*"]): Promise<{ agent: Agent; grant: Grant; session: Promise<void>; stopSession: AbortController }> {
    const agent = await Agent.registerRoot(this.operator, name);
    this.#conns.push(agent.conn);
    const issued = await this.operator.capability.issueRoot({ holderNodeId: agent.nodeId, scopes, ttl: { seconds: 3600n } });
    const grant: Grant = { grant: issued.grant!, token: issued.token, expiresAt: timestampDate(issued.tokenExpiresAt!) };
    const stopSession = new AbortController();
    const session = agent.run({ signal: stopSession.signal, heartbeatMs: 500 }).catch(() => {});
    this.#cleanups.push(async () => {
      stopSession.abort();
      await session;
    });
    await agent.opened;
    return { agent, grant, session, stopSession };
  }

  /**
   * A tool gate on a tool-server token of its own (named after the gate),
   * minted by the admin: the tool ledger accepts only tool servers.
   */
  async gate(id: string, options?: ToolGateOptions): Promise<ToolGate> {
    const resp = await this.operator.auth.createToken({ toolServer: id, ttl: { seconds: 3600n } });
    const g = new ToolGate(this.dial(resp.token), id, options);
    this.#cleanups.push(() => g.close());
    await g.ready;
    return g;
  }

  /** A gate recording each call it ends, in order, and a root scope through it: a framework run's start. */
  async recordedRootScope(gateId: string, name: string, scopes?: string[]): Promise<{ recorded: ToolCall[]; gate: ToolGate; scope: TetherScope }> {
    const recorded: ToolCall[] = [];
    const gate = await this.gate(gateId, { onRecorded: (c) => recorded.push(c) });
    return { recorded, gate, scope: await this.rootScope(name, gate, scopes) };
  }

  /** A root agent (session running, root grant) as the TetherScope a framework run starts from. */
  async rootScope(name: string, gate: ToolGate, scopes?: string[]): Promise<TetherScope> {
    const root = await this.rootAgent(name, scopes);
    return new TetherScope(root.agent, gate, root.agent.capabilityToken(root.grant));
  }

  /**
   * Starts a gated call that stays in flight until released. A drain ends
   * as soon as no call is in flight, so a test that plays "refused while
   * draining" holds one open to keep the termination in its draining phase.
   */
  static async hold(gate: ToolGate, token: TokenSource, tool = "hold"): Promise<{ release: () => void; done: Promise<unknown> }> {
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let begun!: () => void;
    const running = new Promise<void>((resolve) => (begun = resolve));
    const done = gate.call(token, tool, async () => {
      begun();
      await released;
    });
    await running;
    return { release, done };
  }

  /** Waits until signal aborts. */
  static aborted(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      signal.addEventListener("abort", () => resolve(), { once: true });
    });
  }

  /** Drains scope's agent and waits until scope sees it draining. */
  async drained(scope: TetherScope): Promise<void> {
    await this.terminate(scope.agent.nodeId, "drain");
    await TestServer.aborted(scope.drainSignal);
  }

  /**
   * Aborts the child scope spawned that is not its own agent (a handoff
   * target's), after check of it, waits until the child sees it, and
   * returns the child.
   */
  async abortedChild(scope: TetherScope, check: (child: TetherScope) => void = () => {}): Promise<TetherScope> {
    const child = scope.children.find((c) => c.agent.nodeId !== scope.agent.nodeId);
    assert.ok(child);
    check(child);
    await this.terminate(child.agent.nodeId, "abort");
    await TestServer.aborted(child.signal);
    return child;
  }

  /** Terminates a node's subtree and returns the termination id. */
  async terminate(nodeId: string, mode: "drain" | "abort", windowSeconds = 30): Promise<string> {
    const resp = await this.operator.supervisor.terminate({
      nodeId,
      mode: mode === "abort" ? TerminationMode.ABORT : TerminationMode.DRAIN,
      drainWindow: { seconds: BigInt(windowSeconds) },
      cancelAckTimeout: { seconds: 30n },
      confirmTimeout: { seconds: 2n },
      reason: "test",
    });
    return resp.termination!.terminationId;
  }

  /** Waits (on the termination's own stream) until it is terminated, and returns its record. */
  async record(terminationId: string): Promise<ReconciliationRecord> {
    for await (const msg of this.operator.supervisor.watchTermination({ terminationId })) {
      if (msg.termination?.state === TerminationState.TERMINATED) break;
    }
    const resp = await this.operator.supervisor.getRecord({ terminationId });
    return resp.record!;
  }

  async stop(): Promise<void> {
    await this.#end();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  /**
   * Stops the server and starts it again on its data directory (with extra
   * `serve` flags, if any): what it keeps is what a restart keeps (its
   * keys, its nodes), not what it holds in memory (the tokens it verified
   * or minted).
   */
  async restart(...extraArgs: string[]): Promise<TestServer> {
    await this.#end();
    return startServerIn(this.dataDir, undefined, ...extraArgs);
  }

  /**
   * Stops the server, calls between (which may copy its data directory
   * while nothing writes it), and starts a server on dataDir (default its
   * own) on the same address: a Conn dialled before, not by dial(), goes
   * on to the new one.
   */
  async restartInPlace(between: () => void, dataDir = this.dataDir, ...extraArgs: string[]): Promise<TestServer> {
    await this.#end();
    between();
    return startServerIn(dataDir, Number(new URL(this.baseUrl).port), ...extraArgs);
  }

  async #end(): Promise<void> {
    await Promise.all(this.#cleanups.map((c) => c()));
    for (const c of this.#conns) c.close();
    if (this.process.exitCode === null) {
      this.process.kill("SIGTERM");
      await once(this.process, "exit");
    }
  }
}

/** Starts a server (with extra `serve` flags, if any) and waits until it answers. */
export async function startServer(...extraArgs: string[]): Promise<TestServer> {
  return startServerIn(mkdtempSync(join(tmpdir(), "tether-ts-data-")), undefined, ...extraArgs);
}

async function startServerIn(dataDir: string, onPort?: number, ...extraArgs: string[]): Promise<TestServer> {
  const bin = await tetherBinary();
  const port = onPort ?? (await freePort());
  const listen = `127.0.0.1:${port}`;
  const child = spawn(bin, ["serve", "--data-dir", dataDir, "--listen", listen, "--log-level", "warn", ...extraArgs], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr?.on("data", (d) => (stderr += d));
  const baseUrl = `http://${listen}`;
  const tokenFile = join(dataDir, "admin.token");
  // Readiness is a condition to poll for: the server answers /healthz.
  for (let i = 0; ; i++) {
    if (child.exitCode !== null) throw new Error(`tether serve exited: ${stderr}`);
    if (existsSync(tokenFile)) {
      try {
        const resp = await fetch(`${baseUrl}/healthz`);
        if (resp.ok) break;
      } catch {
        // not listening yet
      }
    }
    if (i > 600) throw new Error(`tether serve did not become ready: ${stderr}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return new TestServer(bin, baseUrl, dataDir, readFileSync(tokenFile, "utf8").trim(), child);
}

/**
 * p, or a rejection naming what did not happen within ms: a guard against
 * a hang, not a timing. what is a text, or a function giving one when the
 * guard fires (to read state as it then is).
 */
export function within<T>(p: Promise<T>, ms: number, what: string | (() => string)): Promise<T> {
  let timer!: ReturnType<typeof setTimeout>;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new Error(typeof what === "function" ? `${what()} within ${ms} ms` : `${what} did not happen within ${ms} ms`));
    }, ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
