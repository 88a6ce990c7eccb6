"""The forty-third hostile pass on the Python SDK's tool gate (letters O and
N): a gated tool whose cancel the control plane ordered before the tool
began does not run, nor an adapter's gated tool.

The agent being stopped has its call begun (BeginCall recorded) just as its
abort is ordered: the control plane writes the cancel order of the call it
recorded, and the gate hears it before BeginCall's answer (a round trip the
gate's path, or a loaded control plane, stretches). The gate held the order
(an early order) and set the call's ``cancelled`` as it registered the call,
and then ran the block all the same (``with gate.call(...)``, ``tool_gate``
on a function or a generator, ``ToolGate.run``; an asyncio block up to its
first await): a tool that does its side effect before it looks at
``cancelled`` (most never look) did it after its stop, and the ledger read
the call completed (an asyncio tool's, acknowledged cancelled, its side
effect done). The Go and TypeScript gates did the same until this pass
(rogue43G tests). Now the gate runs no block whose cancel is already
ordered: it acknowledges the cancel and raises ToolCallCancelled.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Callable

import pytest

from helpers import terminate, tool_calls, wait_for
from tether_agentsdk import Conn, ToolCallCancelled, ToolGate, tool_gate


class _HeldBeginAnswer(Conn):
    """The gate's own path to the control plane, holding BeginCall's answer
    until ``hold`` returns: the test orders the abort there and waits for
    the gate to hold the call's cancel order (what a slow answer does, made
    certain)."""

    hold: Callable[[], None] = staticmethod(lambda: None)

    def call(self, service, method, request=None, **kwargs):
        answer = super().call(service, method, request, **kwargs)
        if method == "BeginCall":
            self.hold()
        return answer


def _run(path: str, gate: ToolGate, token: str, ran: list[str]) -> object:
    """One gated call of a tool that writes (ran) before anything else."""
    if path == "with":
        with gate.call(token, "write"):
            ran.append("written")
            return "written"
    if path == "run":
        return gate.run(token, "write", lambda: ran.append("written") or "written")
    if path == "tool_gate":

        @tool_gate(gate, "write", token=token)
        def write() -> str:
            ran.append("written")
            return "written"

        return write()
    if path == "generator":

        @tool_gate(gate, "write", token=token)
        def write_steps():
            ran.append("written")
            yield "written"

        return list(write_steps())
    if path == "async with":

        async def main() -> str:
            async with gate.call(token, "write"):
                ran.append("written")
                await asyncio.sleep(0)
                return "written"

        return asyncio.run(main())
    if path == "async def":

        @tool_gate(gate, "write", token=token)
        async def awrite() -> str:
            ran.append("written")
            await asyncio.sleep(0)
            return "written"

        return asyncio.run(awrite())
    if path == "async generator":

        @tool_gate(gate, "write", token=token)
        async def awrite_steps():
            ran.append("written")
            yield "written"

        async def consume() -> list[str]:
            return [step async for step in awrite_steps()]

        return asyncio.run(consume())
    raise AssertionError(path)


def _early_order_gate(server, tree, label: str):
    """A child with a grant, and a gate whose path holds BeginCall's answer
    until the child's abort has ordered the call cancelled and the gate
    holds that order; the dict the abort's termination is put in."""
    child = tree.root.spawn(label)
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:write"], ttl=600)
    name = f"pytest-gate-{label}-" + uuid.uuid4().hex[:6]
    minted = server.tool_server(name)
    conn = _HeldBeginAnswer(minted.base_url, minted.token, retry=minted.retry)
    gate = ToolGate(conn, name).start()
    term: dict = {}

    def hold() -> None:
        term.update(terminate(tree.operator, child.node_id, "abort", ack="60s", confirm="1s"))
        # A guard against a hang, not a timing.
        wait_for("the gate holding the call's cancel order", lambda: gate.held_orders == 1)

    conn.hold = hold
    assert gate.ready.wait(10), "the gate's cancel orders stream did not open"
    return child, grant, name, gate, term


def _recorded(tree, term: dict) -> list[str]:
    """The resolutions the abort's record gives the child's calls, once it
    is written."""
    assert term, "the abort was never ordered"
    wait_for("the termination to finish",
             lambda: tree.operator.call("SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})
             ["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    return [c["resolution"] for c in tool_calls(tree.operator, term["terminationId"])]


@pytest.mark.parametrize("path", ["with", "run", "tool_gate", "generator", "async with", "async def", "async generator"])
def test_rogue43O_an_early_cancel_order_stops_the_call_before_its_block_runs(server, tree, path):
    child, grant, name, gate, term = _early_order_gate(server, tree, "rogue43O-" + path.replace(" ", "-"))
    try:
        ran: list[str] = []
        try:
            outcome: object = f"returned {_run(path, gate, grant.token, ran)!r}"
        except ToolCallCancelled as e:
            outcome = e
        resolutions = _recorded(tree, term)
        assert ran == [], f"the tool ran {len(ran)} time(s) after its cancel was ordered (the call {outcome}, recorded {resolutions})"
        assert isinstance(outcome, ToolCallCancelled), f"the call {outcome}"
        assert gate.held_orders == 0
        assert resolutions == ["CALL_RESOLUTION_CANCELLED_ACKED"], resolutions
    finally:
        gate.close()


@pytest.mark.parametrize("how", ["langgraph-sync", "langgraph-async", "openai-agents"])
def test_rogue43O_an_adapters_tool_whose_cancel_came_before_it_ran_is_not_run(server, tree, how):
    # The adapters gate every tool of a run with a block of their own
    # (LangGraph's tools, OpenAI Agents' function tools): the same early
    # order ran the tool after its stop there too.
    from conftest import require_extra

    if how.startswith("langgraph"):
        require_extra("langgraph")
        from tether_agentsdk.adapters.langgraph import TetherGraph
    else:
        require_extra("agents")
        from agents import Agent as SDKAgent, FunctionTool
        from tether_agentsdk.adapters.openai_agents import TetherAgents
    child, grant, name, gate, term = _early_order_gate(server, tree, "rogue43O-" + how)
    ran: list[str] = []

    def write(path: str) -> str:
        """Writes."""
        ran.append(path)  # the side effect: done before any look at the call
        return "written"

    async def invoke() -> object:
        if how == "langgraph-async":
            [tool] = TetherGraph(tree.root, gate, token=grant.token, grant_id=grant.grant_id).tools([write])
            return await tool.ainvoke({"path": "/tmp/x"})
        if how == "openai-agents":
            async def on_invoke_tool(ctx, arguments: str) -> str:
                return write("/tmp/x")

            sdk_tool = FunctionTool(name="write", description="Writes.", params_json_schema={"type": "object", "properties": {}}, on_invoke_tool=on_invoke_tool)
            wrapped = TetherAgents(tree.root, gate, token=grant.token, grant_id=grant.grant_id).agent(SDKAgent(name="writer", tools=[sdk_tool]))
            return await wrapped.tools[0].on_invoke_tool(None, "{}")
        raise AssertionError(how)

    try:
        try:
            if how == "langgraph-sync":
                [tool] = TetherGraph(tree.root, gate, token=grant.token, grant_id=grant.grant_id).tools([write])
                outcome: object = tool.invoke({"path": "/tmp/x"})
            else:
                outcome = asyncio.run(invoke())
        except ToolCallCancelled as e:
            outcome = e
        recorded = _recorded(tree, term)
        assert not ran, f"the tool ran {len(ran)} time(s) after its cancel was ordered (the call returned {outcome!r}, recorded {recorded})"
        assert isinstance(outcome, ToolCallCancelled), f"the call returned {outcome!r}"
        assert recorded == ["CALL_RESOLUTION_CANCELLED_ACKED"], recorded
    finally:
        gate.close()
