// A TypeScript agent on @langchain/langgraph under Tether: a ReAct agent's
// tools go through a ToolGate, the research subgraph runs as a spawned
// child node with an attenuated grant, and `tether terminate <node> --mode
// abort` stops it mid-run (the record shows the tool calls it cancelled).
//
// No model service is needed: LangChain's fakeModel plays the model.
//
//   node dist/examples/langgraph.js
import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { fakeModel } from "@langchain/core/testing";
import { tool } from "@langchain/core/tools";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { createReactAgent } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import { gateTools, invokeTethered, tetherSubgraph } from "../src/adapters/langgraph.js";
import { finish, start, work } from "./common.js";

const pages = Number(process.env.PAGES ?? 40);
const pageMs = Number(process.env.PAGE_MS ?? 1000);

const fetchPage = tool(
  async ({ page }, config) => {
    console.log(`fetching page ${page}`);
    await work(pageMs, config.signal!); // the gate's signal: the control plane's cancel order
    console.log(`fetched page ${page}`);
    return `page ${page}: ...`;
  },
  { name: "fetch", description: "fetch a page", schema: z.object({ page: z.number() }) },
);

function researcherModel() {
  const model = fakeModel();
  for (let page = 1; page <= pages; page++) {
    model.respond(new AIMessage({ id: `call-${page}`, content: "", tool_calls: [{ name: "fetch", args: { page }, id: `fetch-${page}`, type: "tool_call" }] }));
  }
  return model.respond(new AIMessage({ id: "summary", content: `read ${pages} pages` }));
}

const scope = await start("lg-planner", "langgraph");
const graph = new StateGraph(MessagesAnnotation)
  .addNode(
    "research",
    tetherSubgraph(scope, "lg-researcher", { scopes: ["tool:fetch"] }, (child) =>
      createReactAgent({ llm: researcherModel(), tools: gateTools(child, [fetchPage]) }),
    ),
  )
  .addEdge(START, "research")
  .addEdge("research", END)
  .compile();

let outcome: unknown;
try {
  const out = await invokeTethered(scope, graph, { messages: [new HumanMessage("research tethers")] }, { recursionLimit: 4 * pages + 10 });
  outcome = out.messages.at(-1)?.content;
} catch (err) {
  outcome = err;
}
await finish(scope, outcome);
