"""The forty-fifth hostile pass on the Python framework adapters: a
synchronous tool. The OpenAI Agents SDK runs a synchronous
``@function_tool`` on a thread (``asyncio.to_thread``); the adapter gated
the call in the run's task, so the run's cancellation (the abort) stopped
the coroutine awaiting the thread, never the thread, and the gate
acknowledged the cancel at once: the termination's record read the call
CANCELLED_ACKED, and the termination ended, while the tool ran on to its
side effect. The TypeScript gate waits for the tool's own end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import require_extra
from helpers import terminate, tool_calls, wait_for

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import Aborted, ToolCallCancelled, current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402

set_tracing_disabled(True)


def _abort_and_record(tree, run_started, inside, release=lambda: None):
    """Aborts the tree with short windows once the tool runs; returns the
    record's calls once the termination ended, and what ``release`` (called
    then, before the loop's threads are waited for) returned."""

    async def main():
        run = asyncio.ensure_future(run_started())
        assert await asyncio.to_thread(inside.wait, 10)
        term = await asyncio.to_thread(terminate, tree.operator, tree.root.node_id, "abort", ack="1s", confirm="1s")
        with pytest.raises((Aborted, ToolCallCancelled)):
            await asyncio.wait_for(run, 30)
        state = lambda: tree.operator.call("SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})["termination"]["state"]  # noqa: E731
        await asyncio.to_thread(wait_for, "the termination to end", lambda: state() == "TERMINATION_STATE_TERMINATED")
        return await asyncio.to_thread(tool_calls, tree.operator, term["terminationId"]), release()

    return main


def test_rogue45j_a_sync_tool_running_on_after_the_abort_is_not_recorded_cancelled(server, tree, gate):
    inside, go, done = threading.Event(), threading.Event(), threading.Event()

    @function_tool
    def wire(amount: str) -> str:
        """Wires money."""
        inside.set()
        go.wait(30)  # deaf to its call's cancel: the transfer goes out after the stop
        done.set()
        return "sent"

    model = ScriptedModel([[function_call("wire", {"amount": "100"}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    agent = tether.agent(SDKAgent(name="payer", model=model, tools=[wire]))
    def release():
        ran = done.is_set()
        go.set()
        return ran

    try:
        calls, ran = asyncio.run(_abort_and_record(tree, lambda: tether.run(agent, "go"), inside, release)())
        assert not ran  # the side effect was still to come when the termination ended
        # Before: [("wire", "CALL_RESOLUTION_CANCELLED_ACKED")], the side
        # effect still to come.
        assert [(c["tool"], c["resolution"]) for c in calls] == [("wire", "CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED")]
    finally:
        go.set()
    assert done.wait(10)


def test_rogue45j_a_sync_tool_that_stops_on_its_cancel_is_acknowledged(server, tree, gate):
    inside, stopped = threading.Event(), threading.Event()

    @function_tool
    def crawl(url: str) -> str:
        """Crawls, looking at its call's cancel."""
        call = current_call()
        inside.set()
        call.cancelled.wait(30)
        stopped.set()
        call.check()  # raises ToolCallCancelled: the call stopped on the order
        return "never"

    model = ScriptedModel([[function_call("crawl", {"url": "u"}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    agent = tether.agent(SDKAgent(name="crawler", model=model, tools=[crawl]))
    calls, _ = asyncio.run(_abort_and_record(tree, lambda: tether.run(agent, "go"), inside)())
    assert stopped.is_set()
    assert [(c["tool"], c["resolution"]) for c in calls] == [("crawl", "CALL_RESOLUTION_CANCELLED_ACKED")]


def test_rogue45j_a_sync_langchain_tool_running_on_after_the_abort_is_not_recorded_cancelled(server, tree, gate):
    require_extra("langgraph")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from tether_agentsdk.adapters.langgraph import TetherGraph

    inside, go, done = threading.Event(), threading.Event(), threading.Event()

    @tool
    def wire(amount: str) -> str:
        """Wires money."""
        inside.set()
        go.wait(30)
        done.set()
        return "sent"

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    model = GenericFakeChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "wire", "args": {"amount": "100"}, "id": "c1"}]),
        AIMessage(content="no"),
    ]))

    async def think(state: MessagesState):
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", think)
    g.add_node("tools", ToolNode(tether.tools([wire])))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    graph = g.compile()

    def release():
        ran = done.is_set()
        go.set()
        return ran

    try:
        calls, ran = asyncio.run(_abort_and_record(
            tree, lambda: tether.ainvoke(graph, {"messages": [HumanMessage(content="go")]}), inside, release)())
        assert not ran
        # Before: [("wire", "CALL_RESOLUTION_CANCELLED_ACKED")].
        assert [(c["tool"], c["resolution"]) for c in calls] == [("wire", "CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED")]
    finally:
        go.set()
    assert done.wait(10)
