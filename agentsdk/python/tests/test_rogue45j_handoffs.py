"""The forty-fifth hostile pass on the Python openai-agents adapter: a
handoff the run's agents already carried. ``TetherAgents.agent()`` gated
the agent's own function tools and kept its handoffs as they were: a
handoff to an agent (or an SDK ``handoff(...)``) not made with
``TetherAgents.handoff()`` ran its target's tools with no gate at all. A
model steered into taking it (a rogue sub-agent) ran them as an agent the
tether did not know: no child node, no grant from the tree, no call in the
ledger, and not refused while the run's agent drained. The TypeScript
adapter's ``tetherAgent`` wraps every handoff it reaches, a spawned child
with the target's tools' scopes."""

from __future__ import annotations


import pytest

from conftest import require_extra

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, handoff as sdk_handoff, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import ToolRefused, current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402

set_tracing_disabled(True)


def _writer(model, ran):
    @function_tool
    def publish(text: str) -> str:
        """Publishes a text."""
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id) if call else None)
        return "published"

    return SDKAgent(name="writer", model=model, tools=[publish])


@pytest.mark.parametrize("as_handoff", [False, True], ids=["agent", "sdk_handoff"])
def test_rogue45j_a_handoff_the_agent_carried_runs_its_tools_as_a_gated_child(server, tree, gate, as_handoff):
    ran = []
    model = ScriptedModel([
        [function_call("transfer_to_writer", {}, call_id="c1")],
        [function_call("publish", {"text": "secret plans"}, call_id="c2")],
        [assistant_message("done")],
    ])
    writer = _writer(model, ran)
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    triage = tether.agent(SDKAgent(name="triage", model=model,
                                   handoffs=[sdk_handoff(writer) if as_handoff else writer]))
    result = tether.run_sync(triage, "go")
    assert result.final_output == "done"

    # Before: ran == [None] (no gated call: nothing in the ledger) and no child.
    assert len(tether.children) == 1, (ran, tether.children)
    [(child, grant)] = tether.children
    assert child.node["parentNodeId"] == tree.root.node_id and child.node["name"] == "writer"
    assert grant.scopes == ["tool:publish"] and grant.grant["parentGrantId"] == tree.root_grant_id
    assert ran == [("publish", child.node_id, grant.grant_id)]


def test_rogue45j_a_handoff_the_agent_carried_is_refused_while_the_run_drains(server, draining, gate):
    tree = draining
    ran = []
    model = ScriptedModel([
        [function_call("transfer_to_writer", {}, call_id="c1")],
        [function_call("publish", {"text": "secret plans"}, call_id="c2")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    triage = tether.agent(SDKAgent(name="triage", model=model, handoffs=[_writer(model, ran)]))
    # Before: the run finished "done" and publish ran (ran == [None])
    # while its agent drained.
    with pytest.raises(ToolRefused) as e:
        tether.run_sync(triage, "go")
    assert e.value.draining, e.value
    assert ran == []


def test_rogue45j_a_cycle_of_handoffs_back_to_the_runs_agent_runs_it_under_the_writer(server, tree, gate):
    """The writer hands back to the (unwrapped) triage agent: the wrapping
    ends at the cycle (each handoff wraps its target when taken). Until
    the forty-sixth pass triage then ran as the run's node, beside the
    writer's subtree, which an operator's stop of the writer did not
    reach; it now runs as a child of the writer, as the TypeScript adapter
    runs it (rogue46b), the writer's grant covering what it hands off to."""
    ran = []
    model = ScriptedModel([
        [function_call("transfer_to_writer", {}, call_id="c1")],
        [function_call("publish", {"text": "draft"}, call_id="c2")],
        [function_call("transfer_to_triage", {}, call_id="c3")],
        [function_call("lookup", {"topic": "x"}, call_id="c4")],
        [assistant_message("done")],
    ])

    @function_tool
    def lookup(topic: str) -> str:
        """Looks a topic up."""
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id) if call else None)
        return "notes"

    writer = _writer(model, ran)
    triage = SDKAgent(name="triage", model=model, tools=[lookup], handoffs=[writer])
    writer.handoffs = [triage]
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    result = tether.run_sync(tether.agent(triage), "go")
    assert result.final_output == "done"
    [(child, grant), (again, again_grant)] = tether.children
    assert grant.scopes == ["tool:publish", "tool:lookup"]
    assert again.node["parentNodeId"] == child.node_id and again.node["name"] == "triage"
    assert again_grant.grant["parentGrantId"] == grant.grant_id
    assert ran == [("publish", child.node_id, grant.grant_id),
                   ("lookup", again.node_id, again_grant.grant_id)]
