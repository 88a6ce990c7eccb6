"""The forty-sixth hostile pass on the Python framework adapters: a
sub-agent's own sub-agents. The OpenAI Agents adapter spawned every
handoff's target as a child of the run's agent, whoever took the handoff:
a target a sub-agent handed off to (the writer's editor) ran beside it, not
under it, its grant delegated from the run's, not from the sub-agent's. An
operator's stop of the sub-agent (its drain, its abort, its grant's
revocation) did not reach the agent it handed off to: the editor, steered
by the writer's model, went on calling its tools through the stop. The
TypeScript adapter spawns the target under the node that took the
handoff, its grant clamped to that node's (``TetherScope.child``)."""

from __future__ import annotations

import threading

import pytest

from conftest import require_extra
from helpers import terminate, wait_for

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, handoff as sdk_handoff, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import ToolRefused, current_call, tool_gate  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402

set_tracing_disabled(True)


def _tool(name: str, ran: list):
    def fn(text: str) -> str:
        call = current_call()
        ran.append((call.tool, call.node_id, call.grant_id) if call else None)
        return name + "d"

    fn.__name__ = name
    fn.__doc__ = f"{name.capitalize()}s a text."
    return function_tool(fn)


def _chain(model, ran, on_editor=None):
    """triage -> writer (draft) -> editor (publish), none of them wrapped."""
    editor = SDKAgent(name="editor", model=model, tools=[_tool("publish", ran)])
    to_editor = sdk_handoff(editor, on_handoff=on_editor) if on_editor else editor
    writer = SDKAgent(name="writer", model=model, tools=[_tool("draft", ran)], handoffs=[to_editor])
    return SDKAgent(name="triage", model=model, handoffs=[writer])


def _script():
    return ScriptedModel([
        [function_call("transfer_to_writer", {}, call_id="c1")],
        [function_call("draft", {"text": "plans"}, call_id="c2")],
        [function_call("transfer_to_editor", {}, call_id="c3")],
        [function_call("publish", {"text": "secret plans"}, call_id="c4")],
        [assistant_message("done")],
    ])


def test_rogue46b_a_handoff_a_sub_agent_takes_spawns_its_target_under_it(server, tree, gate):
    ran = []
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    result = tether.run_sync(tether.agent(_chain(_script(), ran)), "go")
    assert result.final_output == "done"

    [(writer, wgrant), (editor, egrant)] = tether.children
    assert writer.node["parentNodeId"] == tree.root.node_id
    # Before: the editor's parent was the run's agent (root), its grant
    # delegated from the root grant.
    assert editor.node["parentNodeId"] == writer.node_id, (editor.node, writer.node_id)
    assert egrant.grant["parentGrantId"] == wgrant.grant_id
    assert egrant.scopes == ["tool:publish"]
    # Its grant does not outlive the writer's (the control plane refuses
    # one that would: the writer's ten minutes began a moment before).
    assert egrant.grant["expiresAt"] <= wgrant.grant["expiresAt"]
    assert ran == [("draft", writer.node_id, wgrant.grant_id), ("publish", editor.node_id, egrant.grant_id)]


def test_rogue46b_a_drain_of_the_sub_agent_stops_the_agent_it_hands_off_to(server, tree, gate):
    """The operator drains the writer (a call of its own held open, so the
    drain stays open) as it hands off to the editor: the editor's tools
    are the writer's subtree's, refused while it drains."""
    ran = []
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    inside, release = threading.Event(), threading.Event()
    holders = []

    def drain_the_writer(ctx) -> None:
        # The writer, spawned first (the editor, since the forty-eighth
        # pass, spawned under it before this on_handoff runs).
        writer, wgrant = tether.children[0]

        def holder():
            with tool_gate(gate, "draft", token=wgrant.token):
                inside.set()
                release.wait(30)

        t = threading.Thread(target=holder)
        t.start()
        holders.append(t)
        assert inside.wait(10)
        terminate(tree.operator, writer.node_id, "drain", confirm="1s")
        wait_for("the writer draining", lambda: tree.operator.call(
            "AgentService", "GetNode", {"nodeId": writer.node_id})["node"]["state"] == "NODE_STATE_DRAINING")

    try:
        # Before: the run finished "done", publish having run as a child of
        # the root while the writer that handed off to it drained.
        with pytest.raises(ToolRefused) as e:
            tether.run_sync(tether.agent(_chain(_script(), ran, on_editor=drain_the_writer)), "go")
        assert e.value.draining, e.value
        assert [r[0] for r in ran] == ["draft"], ran
    finally:
        release.set()
        for t in holders:
            t.join(30)
