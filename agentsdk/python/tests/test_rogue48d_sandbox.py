"""The forty-eighth hostile pass on the Python OpenAI Agents adapter: a
sandbox agent's capability tools. A ``SandboxAgent``'s ``capabilities``
(``Shell``, ``Filesystem``, the SDK's default set) make their tools
(``exec_command``, ``write_stdin``, ``apply_patch``, ``view_image``) at run
time, once the runner has bound them to the sandbox session
(``RunConfig(sandbox=...)``): after ``TetherAgents.agent()`` had gated the
agent's ``tools``. With a ``UnixLocalSandboxClient`` (the host, no
confinement on Linux) a model steered into ``exec_command`` ran shell
commands on the host as no node of the tree: nothing in the ledger, no
scope asked, not refused while the run drained nor after an operator
aborted the child the handoff to the sandbox agent spawned. And a
``Memory`` capability that generates memories has the SDK run agents of
its own, with a shell, when the sandbox session stops (after the run's
drain too), steered by the run's transcript: refused. Real
``UnixLocalSandboxClient`` sessions, real commands, a real tether."""

from __future__ import annotations

import json

import pytest

from conftest import require_extra

require_extra("agents")

from agents import RunConfig, set_tracing_disabled  # noqa: E402
from agents import Agent as SDKAgent  # noqa: E402
from agents.run_config import SandboxRunConfig  # noqa: E402
from agents.sandbox.config import MemoryGenerateConfig  # noqa: E402
from agents.sandbox import SandboxAgent  # noqa: E402
from agents.sandbox.capabilities import Filesystem, Memory, Shell  # noqa: E402
from agents.sandbox.capabilities.tools import ExecCommandTool, SandboxApplyPatchTool  # noqa: E402
from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseCustomToolCall  # noqa: E402

from tether_agentsdk import current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402
from tether_agentsdk.toolgate import ToolRefused  # noqa: E402
from helpers import abort_child_tool, drain_tool  # noqa: E402

set_tracing_disabled(True)


def _on_the_host():
    return RunConfig(sandbox=SandboxRunConfig(client=UnixLocalSandboxClient()))


def _who(what):
    call = current_call()
    return (what, call.tool, call.node_id) if call else (what, None, None)


def _watched_shell(seen):
    """The SDK's Shell capability, its exec_command the SDK's own, seen
    (with the gated call it runs in, if any) before each command runs."""

    class Watched(ExecCommandTool):
        async def _invoke(self, ctx, raw):
            seen.append(_who("exec_command"))
            return await super()._invoke(ctx, raw)

    def configure(tools):
        made = tools.exec_command
        tools.exec_command = Watched(session=made.session, user=made.user, workspace_scope=made.workspace_scope)

    return Shell(configure_tools=configure)


def _watched_filesystem(seen):
    """The SDK's Filesystem capability, its apply_patch seen likewise."""

    class Watched(SandboxApplyPatchTool):
        async def _on_invoke_tool(self, ctx, raw):
            seen.append(_who("apply_patch"))
            return await super()._on_invoke_tool(ctx, raw)

    def configure(tools):
        made = tools.apply_patch
        tools.apply_patch = Watched(session=made.session, workspace_scope=made.workspace_scope)

    return Filesystem(configure_tools=configure)


def _patch(call_id, path):
    return ResponseCustomToolCall(id=f"ap{call_id}", call_id=call_id, type="custom_tool_call", name="apply_patch",
                                  input=json.dumps({"operation": {"type": "create_file", "path": path, "diff": "+hi\n"}}))


def test_rogue48d_a_sandbox_agents_shell_commands_are_gated_and_refused_while_the_run_drains(server, tree, gate, tmp_path):
    seen = []
    drain = drain_tool(tree)
    model = ScriptedModel([
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/before"}, call_id="c1")],
        [function_call("drain", {"x": "a"}, call_id="c2")],
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/after"}, call_id="c3")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    box = SandboxAgent(name="box", model=model, tools=[drain], capabilities=[_watched_shell(seen)])
    try:
        tether.run_sync(tether.agent(box), "go", run_config=_on_the_host())
    except ToolRefused:
        pass  # the drain's refusal (its grant revoked) ends the run
    # Before: ["after", "before"] and [(exec_command, None, None)] * 2: both
    # commands ran on the host as no node, nothing in the ledger, the
    # second after the drain began.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["before"]
    assert seen == [("exec_command", "exec_command", tree.root.node_id)], seen


def test_rogue48d_a_handoff_targets_sandbox_tools_are_gated_as_its_child_and_refused_once_it_is_aborted(server, tree, gate, tmp_path):
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    seen = []

    abort = abort_child_tool(tree, tether)

    model = ScriptedModel([
        [function_call("transfer_to_box", {}, call_id="c1")],
        [_patch("c2", "notes.md")],
        [function_call("abort", {"x": "a"}, call_id="c3")],
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/after-abort"}, call_id="c4")],
        [assistant_message("done")],
    ])
    box = SandboxAgent(name="box", model=model, tools=[abort], capabilities=[_watched_shell(seen), _watched_filesystem(seen)])
    triage = SDKAgent(name="triage", model=model,
                      handoffs=[tether.handoff(box, scopes=["tool:abort", "tool:exec_command", "tool:apply_patch"])])
    try:
        tether.run_sync(tether.agent(triage), "go", run_config=_on_the_host())
    except ToolRefused:
        pass
    [(child, _)] = tether.children
    # Before: ["after-abort"] and [(apply_patch, None, None), (exec_command,
    # None, None)]: the child's edit recorded nowhere, its command run on
    # the host after the operator's abort of it.
    assert list(tmp_path.iterdir()) == []
    assert seen == [("apply_patch", "apply_patch", child.node_id)], seen



def test_rogue48d_a_sandbox_agent_whose_memory_agents_would_run_the_shell_after_its_stop_is_refused(server, tree, gate, tmp_path):
    drain = drain_tool(tree)

    model = ScriptedModel([
        [function_call("drain", {"x": "a"}, call_id="c1")],
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/refused"}, call_id="c2")],
        [assistant_message("done")],
    ])
    # The SDK's memory agents, run when the sandbox session stops: phase one
    # reads the run's transcript (which the run's model wrote), phase two
    # consolidates; sandbox agents of the SDK's own with its default
    # capabilities, a shell among them.
    remember = ScriptedModel([
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/phase-one"}, call_id="m1")],
        [assistant_message("{}")],
    ])
    consolidate = ScriptedModel([[assistant_message("done")]])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    memory = Memory(generate=MemoryGenerateConfig(phase_one_model=remember, phase_two_model=consolidate))
    box = SandboxAgent(name="box", model=model, tools=[drain], capabilities=[Shell(), Filesystem(), memory])
    # Before: ["phase-one"]: the run's own command was refused after the
    # drain, and the memory agent's ran on the host after it, as no node.
    with pytest.raises(ValueError, match="Memory"):
        tether.run_sync(tether.agent(box), "go", run_config=_on_the_host())
    assert list(tmp_path.iterdir()) == []
    # A memory that only reads runs as any sandbox agent does.
    reader = SandboxAgent(name="reader", model=ScriptedModel([[assistant_message("done")]]),
                          capabilities=[Shell(), Filesystem(), Memory(generate=None)])
    tether.run_sync(tether.agent(reader), "go", run_config=_on_the_host())


def test_rogue48d_a_handoff_to_a_sandbox_agent_gives_its_child_the_scopes_of_its_capabilities_tools(server, tree, gate, tmp_path):
    seen = []
    model = ScriptedModel([
        [function_call("transfer_to_box", {}, call_id="c1")],
        [function_call("exec_command", {"cmd": f"touch {tmp_path}/ran"}, call_id="c2")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    box = SandboxAgent(name="box", model=model, capabilities=[_watched_shell(seen), Filesystem()])
    triage = SDKAgent(name="triage", model=model, handoffs=[box])
    assert tether.run_sync(tether.agent(triage), "go", run_config=_on_the_host()).final_output == "done"
    [(child, grant)] = tether.children
    # Without them the box ran as the node that took the handoff (a target
    # with no function tools), or, with one, as a child refused its shell.
    assert {"tool:exec_command", "tool:write_stdin", "tool:view_image", "tool:apply_patch"} <= set(grant.scopes), grant.scopes
    assert seen == [("exec_command", "exec_command", child.node_id)], seen
    assert [p.name for p in tmp_path.iterdir()] == ["ran"]
