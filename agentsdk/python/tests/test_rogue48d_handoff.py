"""The forty-eighth hostile pass on the Python OpenAI Agents adapter: a
handoff's own callback. An SDK ``handoff(agent, on_handoff=..., input_type=...)``
runs the application's ``on_handoff`` with the input the model gave the
handoff (an escalation filed, a ticket opened, a mail sent) when the model
takes it. The adapter ran it first and spawned the target's child after, so
a model that took the handoff after its agent's drain had ``on_handoff``
run with its input, and only then the spawn refused; the TypeScript adapter
spawns the child first (``TetherScope.child``, refused while the parent
drains) and runs the handoff's own ``onInvokeHandoff`` after."""

from __future__ import annotations

import pytest

from conftest import require_extra

require_extra("agents")

from pydantic import BaseModel  # noqa: E402

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, handoff, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402
from tether_agentsdk.toolgate import ToolRefused  # noqa: E402
from helpers import drain_tool, drained_root_record  # noqa: E402

set_tracing_disabled(True)


class Escalation(BaseModel):
    reason: str


@pytest.mark.parametrize("made_by", ["tether", "sdk"])
def test_rogue48d_a_handoffs_on_handoff_does_not_run_once_the_agent_taking_it_drains(server, tree, gate, made_by):
    filed = []

    async def escalate(ctx, data: Escalation) -> None:
        filed.append(data.reason)  # the application's side effect, the model's input

    drain = drain_tool(tree)

    @function_tool
    def page(who: str) -> str:
        """Pages someone."""
        return "paged"

    model = ScriptedModel([
        [function_call("transfer_to_oncall", {"reason": "before"}, call_id="c1")],
        [function_call("drain", {"x": "a"}, call_id="c2")],
        [function_call("transfer_to_oncall", {"reason": "after the drain"}, call_id="c3")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    oncall = SDKAgent(name="oncall", model=model, tools=[page, drain])
    if made_by == "tether":
        h = tether.handoff(oncall, scopes=["tool:page", "tool:drain"], on_handoff=escalate, input_type=Escalation)
    else:
        h = handoff(oncall, on_handoff=escalate, input_type=Escalation)
    oncall.handoffs = [h]
    with pytest.raises(ToolRefused):
        tether.run_sync(tether.agent(SDKAgent(name="triage", model=model, handoffs=[h])), "go")
    # Before: ["before", "after the drain"]: the second handoff's callback
    # ran with the model's input after the drain began, its child's spawn
    # refused only after it.
    assert filed == ["before"], filed


def test_rogue48d_a_child_spawned_for_a_handoff_its_on_handoff_refuses_leaves_no_node_unaccounted(server, tree, gate):
    """The target is spawned before on_handoff runs; a handoff that
    on_handoff refuses (it raises) leaves a child that never ran, ended as
    one refused its grant is (rogue26 adapters test)."""

    async def refuse(ctx, data: Escalation) -> None:
        raise ValueError("no escalations today")

    @function_tool
    def page(who: str) -> str:
        """Pages someone."""
        raise AssertionError("a refused handoff's target must not run")

    model = ScriptedModel([[function_call("transfer_to_oncall", {"reason": "r"}, call_id="c1")], [assistant_message("no")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    oncall = SDKAgent(name="oncall", model=model, tools=[page])
    triage = tether.agent(SDKAgent(name="triage", model=model, handoffs=[handoff(oncall, on_handoff=refuse, input_type=Escalation)]))
    with pytest.raises(Exception, match="no escalations today"):
        tether.run_sync(triage, "go")
    [(child, _)] = tether.children
    record = drained_root_record(tree)
    outcomes = {n["nodeId"]: n.get("outcome") for n in record["nodes"]}
    assert outcomes.get(child.node_id) == "NODE_OUTCOME_CONFIRMED", outcomes
