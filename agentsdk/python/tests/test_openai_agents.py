"""The openai-agents adapter, driven by the SDK's own ScriptedModel against
a real Tether server: gated tools, a handoff as a spawned child with an
attenuated grant, the run cancelled when its subtree is aborted."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import require_extra
from helpers import terminate, tool_calls, wait_for

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import ModelSettings, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import Aborted, ToolCallCancelled, ToolRefused, current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402

set_tracing_disabled(True)


def finish(tree, mode="abort"):
    """Terminates the run's subtree and returns its record's tool calls."""
    term = terminate(tree.operator, tree.root.node_id, mode, ack="30s", confirm="1s")
    wait_for("the termination to finish", lambda: tree.operator.call(
        "SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    return tool_calls(tree.operator, term["terminationId"])


def test_tools_are_gated_and_a_handoff_is_a_child_with_an_attenuated_grant(server, tree, gate):
    begun = []  # what the ledger recorded for each call, seen from inside the tool

    def record():
        call = current_call()
        begun.append((call.tool, call.node_id, call.grant_id, call.gate.gate_id))

    @function_tool
    def lookup(topic: str) -> str:
        """Looks a topic up."""
        record()
        return "notes on " + topic

    @function_tool
    async def search(query: str) -> str:
        """Searches."""
        record()
        return "results for " + query

    @function_tool
    def shell(command: str) -> str:
        """Runs a command."""
        raise AssertionError("the child's grant does not allow shell: the tool must not run")

    model = ScriptedModel([
        [function_call("lookup", {"topic": "tethers"}, call_id="c1")],
        [function_call("transfer_to_researcher", {}, call_id="c2")],
        [function_call("search", {"query": "revocable"}, call_id="c3")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = SDKAgent(name="researcher", model=model, tools=[search, shell])
    triage = tether.agent(SDKAgent(name="triage", model=model, tools=[lookup]),
                          handoffs=[tether.handoff(researcher, scopes=["tool:search"])])
    assert tether.children == []  # spawned only when the handoff is taken
    result = tether.run_sync(triage, "find out")
    assert result.final_output == "done"

    [(child, grant)] = tether.children
    assert child.node["parentNodeId"] == tree.root.node_id and child.node["name"] == "researcher"
    assert grant.scopes == ["tool:search"] and grant.grant["parentGrantId"] == tree.root_grant_id
    assert begun == [("lookup", tree.root.node_id, tree.root_grant_id, gate.gate_id),
                     ("search", child.node_id, grant.grant_id, gate.gate_id)]

    # The child's grant is attenuated: its shell call is refused by the
    # control plane, and the tool never runs.
    model.extend([
        [function_call("transfer_to_researcher", {}, call_id="c4")],
        [function_call("shell", {"command": "rm -rf /"}, call_id="c5")],
        [assistant_message("unreachable")],
    ])
    with pytest.raises(ToolRefused) as e:
        tether.run_sync(triage, "again")
    assert e.value.code == "permission_denied"


def test_a_draining_subtree_refuses_the_runs_tool_calls(server, draining, gate):
    tree = draining
    @function_tool
    def lookup(topic: str) -> str:
        """Looks a topic up."""
        raise AssertionError("refused calls must not run")

    model = ScriptedModel([[function_call("lookup", {"topic": "x"}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    with pytest.raises(ToolRefused) as e:
        tether.run_sync(tether.agent(SDKAgent(name="triage", model=model, tools=[lookup])), "go")
    assert e.value.draining


def test_an_abort_cancels_the_run_and_its_tool_call(server, tree, gate):
    inside = threading.Event()
    observed = threading.Event()

    @function_tool
    async def crawl(url: str) -> str:
        """Crawls for a long time."""
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            observed.set()
            raise
        return "never"

    model = ScriptedModel([[function_call("crawl", {"url": "https://example.test"}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    crawler = tether.agent(SDKAgent(name="crawler", model=model, tools=[crawl]))

    async def main():
        run = asyncio.ensure_future(tether.run(crawler, "go"))
        await asyncio.to_thread(inside.wait, 10)
        calls = await asyncio.to_thread(finish, tree)
        with pytest.raises((Aborted, ToolCallCancelled)):
            await asyncio.wait_for(run, 30)
        return calls

    calls = asyncio.run(main())
    assert observed.is_set()
    assert [(c["tool"], c["resolution"]) for c in calls] == [("crawl", "CALL_RESOLUTION_CANCELLED_ACKED")]


def test_an_abort_cancels_a_run_waiting_on_its_model(server, tree, gate):
    thinking = threading.Event()

    async def slow_model(call):
        thinking.set()
        await asyncio.Event().wait()  # a model that never answers

    model = ScriptedModel([ModelStep.respond(slow_model)])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    thinker = tether.agent(SDKAgent(name="thinker", model=model, model_settings=ModelSettings()))

    async def main():
        run = asyncio.ensure_future(tether.run(thinker, "go"))
        await asyncio.to_thread(thinking.wait, 10)
        await asyncio.to_thread(terminate, tree.operator, tree.root.node_id, "abort")
        with pytest.raises(Aborted):
            await asyncio.wait_for(run, 30)

    asyncio.run(main())
