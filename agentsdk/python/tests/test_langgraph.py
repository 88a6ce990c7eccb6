"""The LangGraph adapter, driven by LangChain's own fake chat model against
a real Tether server: gated tool nodes, a subgraph as a spawned child with
an attenuated grant, the run cancelled when its subtree is aborted."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import require_extra
from helpers import terminate, tool_calls, wait_for

require_extra("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from tether_agentsdk import Aborted, ToolCallCancelled, ToolRefused, current_call  # noqa: E402
from tether_agentsdk.adapters.langgraph import TetherGraph  # noqa: E402


def calls(*names_args):
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call-{i}-{n}"} for i, (n, a) in enumerate(names_args)])


def react(model, tools):
    """The usual agent loop: the model, then its tool calls, until it
    answers without one."""

    async def think(state: MessagesState):
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", think)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def finish(tree, mode="abort"):
    term = terminate(tree.operator, tree.root.node_id, mode, ack="30s", confirm="1s")
    wait_for("the termination to finish", lambda: tree.operator.call(
        "SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    return tool_calls(tree.operator, term["terminationId"])


def test_tool_nodes_are_gated_and_a_subgraph_is_a_child_with_an_attenuated_grant(server, tree, gate):
    begun = []

    def record():
        call = current_call()
        begun.append((call.tool, call.node_id, call.grant_id))

    @tool
    def lookup(topic: str) -> str:
        """Looks a topic up."""
        record()
        return "notes on " + topic

    @tool
    async def search(query: str) -> str:
        """Searches."""
        record()
        return "results for " + query

    @tool
    def shell(command: str) -> str:
        """Runs a command."""
        raise AssertionError("the child's grant does not allow shell: the tool must not run")

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    planner_model = GenericFakeChatModel(messages=iter([calls(("lookup", {"topic": "tethers"})), AIMessage(content="over to research")]))
    research_model = GenericFakeChatModel(messages=iter([calls(("search", {"query": "revocable"})), AIMessage(content="done"),
                                                         calls(("shell", {"command": "rm -rf /"}))]))
    researcher = tether.sub_agent("researcher", scopes=["tool:search"])
    builder = StateGraph(MessagesState)
    builder.add_node("planner", react(planner_model, tether.tools([lookup])))
    builder.add_node("researcher", researcher.node(react(research_model, researcher.tools([search, shell]))))
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "researcher")
    builder.add_edge("researcher", END)
    graph = builder.compile()

    assert researcher.child is None  # spawned when its subgraph is entered
    out = tether.invoke(graph, {"messages": [HumanMessage(content="find out")]})
    assert out["messages"][-1].content == "done"
    child, grant = researcher.child, researcher.grant
    assert child.node["parentNodeId"] == tree.root.node_id and child.node["name"] == "researcher"
    assert grant.scopes == ["tool:search"] and grant.grant["parentGrantId"] == tree.root_grant_id
    assert begun == [("lookup", tree.root.node_id, tree.root_grant_id), ("search", child.node_id, grant.grant_id)]

    # Outside the child's grant: the control plane refuses, the tool never
    # runs, and the refusal ends the run.
    sub_only = StateGraph(MessagesState)
    sub_only.add_node("researcher", researcher.node(react(research_model, researcher.tools([search, shell]))))
    sub_only.add_edge(START, "researcher")
    sub_only.add_edge("researcher", END)
    with pytest.raises(ToolRefused) as e:
        tether.invoke(sub_only.compile(), {"messages": [HumanMessage(content="again")]})
    assert e.value.code == "permission_denied"


def test_a_draining_subtree_refuses_the_graphs_tool_calls(server, draining, gate):
    tree = draining
    @tool
    def lookup(topic: str) -> str:
        """Looks a topic up."""
        raise AssertionError("refused calls must not run")

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    model = GenericFakeChatModel(messages=iter([calls(("lookup", {"topic": "x"})), AIMessage(content="no")]))
    with pytest.raises(ToolRefused) as e:
        tether.invoke(react(model, tether.tools([lookup])), {"messages": [HumanMessage(content="go")]})
    assert e.value.draining


def test_an_abort_cancels_the_graph_and_its_tool_call(server, tree, gate):
    inside, observed = threading.Event(), threading.Event()

    @tool
    async def crawl(url: str) -> str:
        """Crawls for a long time."""
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            observed.set()
            raise
        return "never"

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    model = GenericFakeChatModel(messages=iter([calls(("crawl", {"url": "https://example.test"})), AIMessage(content="no")]))
    graph = react(model, tether.tools([crawl]))

    async def main():
        run = asyncio.ensure_future(tether.ainvoke(graph, {"messages": [HumanMessage(content="go")]}))
        await asyncio.to_thread(inside.wait, 10)
        recorded = await asyncio.to_thread(finish, tree)
        with pytest.raises((Aborted, ToolCallCancelled)):
            await asyncio.wait_for(run, 30)
        return recorded

    recorded = asyncio.run(main())
    assert observed.is_set()
    assert [(c["tool"], c["resolution"]) for c in recorded] == [("crawl", "CALL_RESOLUTION_CANCELLED_ACKED")]


def test_an_abort_cancels_a_graph_waiting_on_its_model(server, tree, gate):
    thinking, release = threading.Event(), threading.Event()

    def never_answers():
        thinking.set()
        release.wait(60)  # the fake model's next message never comes in time
        yield AIMessage(content="too late")

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    graph = react(GenericFakeChatModel(messages=never_answers()), tether.tools([]))

    async def main():
        run = asyncio.ensure_future(tether.ainvoke(graph, {"messages": [HumanMessage(content="go")]}))
        await asyncio.to_thread(thinking.wait, 10)
        await asyncio.to_thread(terminate, tree.operator, tree.root.node_id, "abort")
        try:
            with pytest.raises(Aborted):
                await asyncio.wait_for(run, 30)
        finally:
            release.set()  # let the model's thread go before the loop waits for it

    asyncio.run(main())
