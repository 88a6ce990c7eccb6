"""The forty-sixth hostile pass on the Python LangGraph adapter: a
sub-agent's own sub-agent (a subgraph its graph enters). Every
``sub_agent()`` was a child of the run's agent: the one a sub-agent's
graph entered ran beside it, its grant delegated from the run's, and an
operator's stop of the sub-agent did not reach it. ``SubAgent.sub_agent``
spawns it under the sub-agent, its grant delegated from the sub-agent's
and clamped to it, as the TypeScript ``tetherSubgraph`` does under the
scope it is given."""

from __future__ import annotations

import asyncio

import pytest

from conftest import drain_holding_a_call, require_extra
from helpers import wait_for

require_extra("langgraph")

from langchain_core.tools import tool  # noqa: E402

from tether_agentsdk import ToolRefused, current_call  # noqa: E402
from tether_agentsdk.adapters.langgraph import TetherGraph  # noqa: E402


def test_rogue46b_a_sub_agents_sub_agent_is_refused_while_the_sub_agent_drains(server, tree, gate):
    ran = []

    @tool
    def search(q: str) -> str:
        """Searches."""
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id))
        return "found"

    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = tether.sub_agent("researcher", scopes=["tool:search", "tool:hold"])
    searcher = researcher.sub_agent("searcher", scopes=["tool:search"])
    [gated] = searcher.tools([search])
    assert asyncio.run(gated.ainvoke({"q": "a"})) == "found"

    [(parent, pgrant), (child, cgrant)] = tether.children
    assert parent.node["parentNodeId"] == tree.root.node_id
    assert child.node["parentNodeId"] == parent.node_id
    assert cgrant.grant["parentGrantId"] == pgrant.grant_id
    assert cgrant.grant["expiresAt"] <= pgrant.grant["expiresAt"]
    assert ran == [("search", child.node_id, cgrant.grant_id)]

    # The operator drains the researcher, a call of its own held open.
    with drain_holding_a_call(tree.operator, gate, pgrant.token, parent.node_id):
        wait_for("the researcher draining", lambda: tree.operator.call(
            "AgentService", "GetNode", {"nodeId": parent.node_id})["node"]["state"] == "NODE_STATE_DRAINING")
        with pytest.raises(ToolRefused) as e:
            asyncio.run(gated.ainvoke({"q": "b"}))
        assert e.value.draining, e.value
        assert len(ran) == 1
