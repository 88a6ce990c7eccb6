// What both examples share: connecting to the control plane as an operator,
// registering the root agent with a grant, and the tool gate.
import { readFileSync } from "node:fs";

import { Agent, Conn, TetherScope, ToolGate } from "../src/index.js";

/**
 * Registers a root agent named name with a root grant for tool:*, opens its
 * session, and returns the scope a framework run starts from.
 *
 * Environment: TETHER_ADDR (default http://127.0.0.1:7420); TETHER_TOKEN,
 * an operator token (default: the local server's tether-data/admin.token);
 * TETHER_TOOL_TOKEN, the gate's own tool-server token (`tether token create
 * --tool-server <name>-gate`; by default minted here with the operator token:
 * in a real deployment the gate runs in the tool server with a token of its
 * own, which the agent never holds).
 */
export async function start(name: string, framework: string): Promise<TetherScope> {
  const addr = process.env.TETHER_ADDR ?? "http://127.0.0.1:7420";
  const token = process.env.TETHER_TOKEN ?? readFileSync(`${process.env.TETHER_DATA_DIR ?? "tether-data"}/admin.token`, "utf8").trim();
  const operator = Conn.dial(addr, token);
  const agent = await Agent.registerRoot(operator, name, { framework });
  const issued = await operator.capability.issueRoot({ holderNodeId: agent.nodeId, scopes: ["tool:*"], ttl: { seconds: 3600n } });
  const toolToken = process.env.TETHER_TOOL_TOKEN ?? (await operator.auth.createToken({ toolServer: `${name}-gate`, ttl: { seconds: 3600n } })).token;
  operator.close();
  const gate = new ToolGate(Conn.dial(addr, toolToken), `${name}-gate`);
  await gate.ready;
  const grant = { grant: issued.grant!, token: issued.token, expiresAt: new Date(Number(issued.tokenExpiresAt!.seconds) * 1000) };
  const scope = new TetherScope(agent, gate, agent.capabilityToken(grant));
  scope.startSession();
  await agent.opened;
  console.log(`node ${agent.nodeId}: stop me with: tether terminate ${agent.nodeId} --mode abort --wait`);
  return scope;
}

/** A tool's work: ms of waiting that ends early, with the reason, when signal aborts. */
export function work(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}

/** Ends the process after the run: confirms the exit unless the control plane already ended the node. */
export async function finish(scope: TetherScope, outcome: unknown): Promise<void> {
  if (scope.signal.aborted) {
    console.log(`stopped by tether: ${(scope.signal.reason as Error).message}`);
  } else {
    console.log(`finished: ${String(outcome)}`);
    await scope.agent.confirmExit("finished").catch(() => {});
  }
  await scope.gate.close();
  scope.agent.close();
  scope.gate.conn.close();
  process.exit(0);
}
