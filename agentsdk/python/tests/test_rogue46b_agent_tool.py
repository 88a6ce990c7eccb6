"""The forty-sixth hostile pass on the Python OpenAI Agents adapter: an
agent run as a tool (``as_tool``). The adapter gated the outer call (the
tool ``research``) and ran the agent behind it as it was: its own tools ran
with no gate inside that one call, as no node of the tree, recorded
nowhere, needing no scope, and not refused while the run drained. A model
steered into the agent tool ran, through the drain of the run's agent,
every tool of the agent behind it (``delete``)."""

from __future__ import annotations

import pytest

from conftest import require_extra

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402
from helpers import terminate  # noqa: E402

set_tracing_disabled(True)


def _researcher(model, ran, on_look=lambda: None):
    @function_tool
    async def look(topic: str) -> str:
        """Looks a topic up."""
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id) if call else ("look", None, None))
        on_look()
        return "notes"

    @function_tool
    async def delete(path: str) -> str:
        """Deletes a file."""
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id) if call else ("delete", None, None))
        return "deleted"

    return SDKAgent(name="researcher", model=model, tools=[look, delete])


def _script():
    return ScriptedModel([
        [function_call("research", {"input": "x"}, call_id="c1")],
        [function_call("look", {"topic": "x"}, call_id="c2")],
        [function_call("delete", {"path": "/data"}, call_id="c3")],
        [assistant_message("inner done")],
        [assistant_message("done")],
    ])


def test_rogue46b_an_agent_tool_the_adapter_did_not_make_is_refused_not_run_ungated(server, tree, gate):
    ran = []
    model = _script()
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    triage = SDKAgent(name="triage", model=model,
                      tools=[_researcher(model, ran).as_tool("research", "Researches a topic.")])
    # Before: wrapped, and its run called look and delete with no gate
    # (current_call() None: nothing in the ledger), delete while the run's
    # agent drained.
    with pytest.raises(ValueError, match="agent_tool"):
        tether.agent(triage)


def test_rogue46b_an_agent_tool_runs_as_a_child_refused_while_the_run_drains(server, tree, gate):
    ran = []
    model = _script()

    def drain_the_run():
        terminate(tree.operator, tree.root.node_id, "drain", confirm="1s")
        assert tree.root.draining.wait(10)

    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    research = tether.agent_tool(_researcher(model, ran, drain_the_run), tool_name="research",
                                 tool_description="Researches a topic.")
    triage = SDKAgent(name="triage", model=model, tools=[research])
    tether.run_sync(tether.agent(triage), "go")

    [(child, grant)] = tether.children
    assert child.node["parentNodeId"] == tree.root.node_id and child.node["name"] == "researcher"
    assert grant.scopes == ["tool:look", "tool:delete"]
    # look ran as the child, through the gate; delete, called once the
    # run's agent drained, was refused (the agent tool's run failed, its
    # error the outer model's to read).
    assert ran == [("look", child.node_id, grant.grant_id)], ran
