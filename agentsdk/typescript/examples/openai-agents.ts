// A TypeScript agent on @openai/agents under Tether: its tools go through a
// ToolGate, its handoff to a researcher spawns a child node with an
// attenuated grant, and `tether terminate <node> --mode abort` stops it
// mid-run (the record shows the tool calls it cancelled).
//
// No model service is needed: the framework's ScriptedModel plays the
// model, fetching one page after another.
//
//   node dist/examples/openai-agents.js
import { Agent, setTracingDisabled, tool } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from "@openai/agents/testing";
import { z } from "zod";

import { runTethered } from "../src/adapters/openai-agents.js";
import { finish, start, work } from "./common.js";

setTracingDisabled(true);
const pages = Number(process.env.PAGES ?? 40);
const pageMs = Number(process.env.PAGE_MS ?? 1000);

const fetchPage = tool({
  name: "fetch",
  description: "fetch a page",
  parameters: z.object({ page: z.number() }),
  execute: async ({ page }, _context, details) => {
    console.log(`fetching page ${page}`);
    await work(pageMs, details!.signal!); // the gate's signal: the control plane's cancel order
    console.log(`fetched page ${page}`);
    return `page ${page}: ...`;
  },
});

let page = 0;
const researcher = new Agent({
  name: "researcher",
  instructions: "Fetch every page, then summarise.",
  tools: [fetchPage],
  model: new ScriptedModel(
    Array.from({ length: pages + 1 }, () =>
      modelResponder(() => (++page <= pages ? [functionCall("fetch", { page }, { callId: `fetch-${page}` })] : [assistantMessage(`read ${pages} pages`)])),
    ),
  ),
});
const triage = new Agent({
  name: "triage",
  instructions: "Hand research to the researcher.",
  handoffs: [researcher],
  model: new ScriptedModel([[functionCall("transfer_to_researcher", {}, { callId: "handoff-1" })]]),
});

const scope = await start("oa-triage", "openai-agents");
let outcome: unknown;
try {
  outcome = (await runTethered(scope, triage, "research tethers")).finalOutput;
} catch (err) {
  outcome = err;
}
await finish(scope, outcome);
