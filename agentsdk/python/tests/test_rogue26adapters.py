"""The twenty-sixth hostile pass on the Python SDK's framework adapters: a
sub-agent taken while the run's agent is being stopped. The adapters
promise that a refusal fails the run with ToolRefused, which an agent
catches to wait for its stop's signal and confirm its exit; the spawn of
a handoff's or subgraph's child, refused (failed_precondition) once the
run's agent drains, escaped as a bare ConnectError (wrapped by the
framework) instead."""

from __future__ import annotations

import asyncio

import pytest

from conftest import require_extra
from helpers import drained_root_record

require_extra("agents")
require_extra("langgraph")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import ToolRefused  # noqa: E402
from tether_agentsdk.adapters.langgraph import TetherGraph  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402

set_tracing_disabled(True)


def test_a_handoff_taken_while_draining_fails_the_run_with_tool_refused(draining, gate):
    tree = draining

    @function_tool
    def search(query: str) -> str:
        """Searches."""
        raise AssertionError("a refused sub-agent must not run its tools")

    model = ScriptedModel([[function_call("transfer_to_researcher", {}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = SDKAgent(name="researcher", model=model, tools=[search])
    triage = tether.agent(SDKAgent(name="triage", model=model), handoffs=[tether.handoff(researcher, scopes=["tool:search"])])
    with pytest.raises(ToolRefused) as e:
        tether.run_sync(triage, "go")
    assert e.value.draining, e.value
    assert tether.children == []


def test_a_subgraph_entered_while_draining_fails_the_run_with_tool_refused(draining, gate):
    tree = draining
    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = tether.sub_agent("researcher", scopes=["tool:search"])

    class Subgraph:
        async def ainvoke(self, state, config=None):
            raise AssertionError("a refused sub-agent must not run")

    node = researcher.node(Subgraph())
    with pytest.raises(ToolRefused) as e:
        asyncio.run(node({"messages": []}))
    assert e.value.draining, e.value


def test_a_sub_agent_refused_its_grant_leaves_no_node_unaccounted(server, tree, gate):
    """A handoff whose scopes the run's grant does not cover: the child is
    spawned, its delegation refused (permission_denied) and the run fails
    with ToolRefused. The child node, which never ran, was left behind with
    nobody to confirm its exit: the next termination's record counted it
    unaccounted, an honest run's sub-agent reading as a rogue."""

    @function_tool
    def search(query: str) -> str:
        """Searches."""
        raise AssertionError("a sub-agent without a grant must not run its tools")

    model = ScriptedModel([[function_call("transfer_to_researcher", {}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = SDKAgent(name="researcher", model=model, tools=[search])
    triage = tether.agent(SDKAgent(name="triage", model=model), handoffs=[tether.handoff(researcher, scopes=["mcp:fs/*"])])
    with pytest.raises(ToolRefused) as e:
        tether.run_sync(triage, "go")
    assert e.value.code == "permission_denied", e.value
    record = drained_root_record(tree)
    outcomes = {n["name"]: (n.get("outcome"), n.get("unaccountedReason", "")) for n in record["nodes"]}
    assert all(o == "NODE_OUTCOME_CONFIRMED" for o, _ in outcomes.values()), outcomes
