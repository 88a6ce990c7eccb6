"""The forty-seventh hostile pass on the Python OpenAI Agents adapter: the
tools an agent's MCP servers serve (``Agent(mcp_servers=[...])``). The SDK
lists a server's tools at run time and calls ``server.call_tool`` for each
one the model asks for; the adapter gated the agent's function tools and
local tools and kept its MCP servers as they were. A model steered into an
MCP tool ran it as no node of the tree: nothing in the ledger, no scope
asked, not refused while the run's agent drained, and a handoff target's
MCP tool ran on after an operator aborted the child the handoff spawned.
The server here is a real one (the ``mcp`` package's, over stdio, in a
process of its own), which writes down each deletion it made."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from conftest import require_extra

require_extra("agents")
require_extra("mcp")

from agents import Agent as SDKAgent  # noqa: E402
from agents import function_tool, set_tracing_disabled  # noqa: E402
from agents.mcp import MCPServerStdio  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from tether_agentsdk import Agent  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402
from tether_agentsdk.toolgate import ToolRefused  # noqa: E402
from helpers import terminate, wait_for  # noqa: E402

set_tracing_disabled(True)

SERVER = str(Path(__file__).with_name("mcp_rogue47i_server.py"))


@pytest.fixture
def root(server, request):
    """A root agent holding tool:* and mcp:*, running; (operator, agent, grant id, token)."""
    op = server.operator()
    agent = Agent.register_root(op, request.node.name[:60])
    agent.heartbeat_every = 0.5
    g = op.call("CapabilityService", "IssueRoot", {"holderNodeId": agent.node_id, "scopes": ["tool:*", "mcp:*"], "ttl": "3600s"})
    agent.start()
    assert agent.opened.wait(10), "the root's signal stream did not open"
    yield op, agent, g["grant"]["grantId"], g["token"]
    agent.close()


def _files(log: Path) -> MCPServerStdio:
    return MCPServerStdio({"command": sys.executable, "args": [SERVER, str(log)]}, name="files",
                          client_session_timeout_seconds=60)


def _ran(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _recording(gate) -> list[tuple[str, str]]:
    """(tool, node) of each call the control plane recorded begun through
    gate, from its answers to the gate's BeginCall."""
    recorded = []
    begin = gate._begin

    def recorded_begin(*args, **kwargs):
        call = begin(*args, **kwargs)
        recorded.append((call.tool, call.node_id))
        return call

    gate._begin = recorded_begin
    return recorded


def test_rogue47i_an_mcp_tool_is_gated_as_the_run_node_and_refused_while_it_drains(root, gate, tmp_path):
    op, agent, grant_id, token = root
    log = tmp_path / "ran.txt"
    recorded = _recording(gate)

    @function_tool
    def drain(x: str) -> str:
        """Drains the run."""
        terminate(op, agent.node_id, "drain", confirm="1s")
        assert agent.draining.wait(10)
        return "drained"

    model = ScriptedModel([
        [function_call("delete", {"path": "notes.md"}, call_id="c1")],
        [function_call("drain", {"x": "a"}, call_id="c2")],
        [function_call("delete", {"path": "ledger.db"}, call_id="c3")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(agent, gate, token=token, grant_id=grant_id)

    async def go():
        async with _files(log) as files:
            triage = SDKAgent(name="triage", model=model, tools=[drain], mcp_servers=[files])
            try:
                await tether.run(tether.agent(triage), "go")
            except ToolRefused:
                pass


    asyncio.run(go())
    # Before: ["delete notes.md", "delete ledger.db"], the second after the
    # drain began, and the ledger holding [("drain", root)] alone.
    assert _ran(log) == ["delete notes.md"], _ran(log)
    assert recorded == [("files/delete", agent.node_id), ("drain", agent.node_id)], recorded


def test_rogue47i_a_handoff_targets_mcp_tool_is_gated_as_its_child_and_refused_once_it_is_aborted(root, gate, tmp_path):
    op, agent, grant_id, token = root
    log = tmp_path / "ran.txt"
    recorded = _recording(gate)
    tether = TetherAgents(agent, gate, token=token, grant_id=grant_id)

    @function_tool
    def abort(x: str) -> str:
        """Aborts the editor's child."""
        [(child, _)] = tether.children
        terminate(op, child.node_id, "abort", confirm="1s")
        wait_for("the editor aborting", lambda: op.call(
            "AgentService", "GetNode", {"nodeId": child.node_id})["node"]["state"] in (
            "NODE_STATE_ABORTING", "NODE_STATE_TERMINATED"))
        return "aborted"

    model = ScriptedModel([
        [function_call("transfer_to_editor", {}, call_id="c1")],
        [function_call("delete", {"path": "notes.md"}, call_id="c2")],
        [function_call("abort", {"x": "a"}, call_id="c3")],
        [function_call("delete", {"path": "ledger.db"}, call_id="c4")],
        [assistant_message("done")],
    ])

    async def go():
        async with _files(log) as files:
            editor = SDKAgent(name="editor", model=model, tools=[abort], mcp_servers=[files])
            triage = SDKAgent(name="triage", model=model, handoffs=[editor])
            try:
                await tether.run(tether.agent(triage), "go")
            except ToolRefused:
                pass


    asyncio.run(go())
    [(child, grant)] = tether.children
    # Before: ["delete notes.md", "delete ledger.db"], the second after the
    # operator's abort of the child, and no call of the child's in the ledger.
    assert _ran(log) == ["delete notes.md"], _ran(log)
    assert [r for r in recorded if r[0] == "files/delete"] == [("files/delete", child.node_id)], recorded
    assert "mcp:files/*" in grant.scopes, grant.scopes
