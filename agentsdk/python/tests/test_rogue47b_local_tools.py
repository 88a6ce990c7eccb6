"""The forty-seventh hostile pass on the Python OpenAI Agents adapter: the
tools the SDK runs in this process that are not function tools. The adapter
gated each ``FunctionTool`` and kept every other tool as it was, but a
``ShellTool`` (a local executor), a ``LocalShellTool``, an
``ApplyPatchTool`` (an editor), a ``CustomTool`` and a ``ComputerTool`` run
here, on the host, each call the model asks for. A model steered into one
ran shell commands and deleted files as no node of the tree: nothing in the
ledger (``current_call()`` None inside it), no scope asked, not refused
while the run's agent drained, and a handoff target's editor ran on after
an operator aborted the child the handoff spawned."""

from __future__ import annotations

import pytest

from conftest import require_extra

require_extra("agents")

from agents import Agent as SDKAgent  # noqa: E402
from agents import ApplyPatchTool, Computer, ComputerTool, ShellTool, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseApplyPatchToolCall, ResponseComputerToolCall  # noqa: E402
from openai.types.responses import ResponseFunctionShellToolCall  # noqa: E402

from tether_agentsdk import current_call  # noqa: E402
from tether_agentsdk.adapters.openai_agents import TetherAgents  # noqa: E402
from tether_agentsdk.toolgate import ToolRefused  # noqa: E402
from helpers import abort_child_tool, terminate  # noqa: E402

set_tracing_disabled(True)


def _who(what):
    call = current_call()
    return (what, call.tool, call.node_id) if call else (what, None, None)


def _shell_call(call_id, *commands):
    return ResponseFunctionShellToolCall(id=f"sh{call_id}", call_id=call_id, type="shell_call", status="completed",
                                         action={"commands": list(commands)})


def _patch_call(call_id, path):
    return ResponseApplyPatchToolCall(id=f"ap{call_id}", call_id=call_id, type="apply_patch_call", status="completed",
                                      operation={"type": "delete_file", "path": path})


def test_rogue47b_a_local_shell_tools_commands_are_gated_and_refused_while_the_run_drains(server, tree, gate):
    ran = []

    async def shell(request):
        ran.append(_who(request.data.action.commands[0]))
        return "ok"

    @function_tool
    def drain(x: str) -> str:
        """Drains the run."""
        terminate(tree.operator, tree.root.node_id, "drain", confirm="1s")
        assert tree.root.draining.wait(10)
        return "drained"

    model = ScriptedModel([
        [_shell_call("c1", "ls /data")],
        [function_call("drain", {"x": "a"}, call_id="c2")],
        [_shell_call("c3", "rm -rf /data")],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    triage = SDKAgent(name="triage", model=model, tools=[ShellTool(executor=shell), drain])
    tether.run_sync(tether.agent(triage), "go")
    # Before: [("ls /data", None, None), ("rm -rf /data", None, None)]: both
    # commands run as no node, nothing in the ledger, the second after the
    # drain began.
    assert ran == [("ls /data", "shell", tree.root.node_id)], ran


def test_rogue47b_an_editor_a_handoff_target_holds_is_gated_as_its_child_and_refused_once_it_is_aborted(server, tree, gate):
    ran = []

    class Editor:
        def create_file(self, op):
            ran.append(_who(f"create {op.path}"))

        def update_file(self, op):
            ran.append(_who(f"update {op.path}"))

        def delete_file(self, op):
            ran.append(_who(f"delete {op.path}"))

    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)

    abort = abort_child_tool(tree, tether, confirm="1s")

    model = ScriptedModel([
        [function_call("transfer_to_editor", {}, call_id="c1")],
        [_patch_call("c2", "notes.md")],
        [function_call("abort", {"x": "a"}, call_id="c3")],
        [_patch_call("c4", "ledger.db")],
        [assistant_message("done")],
    ])
    editor = SDKAgent(name="editor", model=model, tools=[ApplyPatchTool(editor=Editor()), abort])
    triage = SDKAgent(name="triage", model=model, handoffs=[editor])
    try:
        tether.run_sync(tether.agent(triage), "go")
    except ToolRefused:
        pass
    [(child, grant)] = tether.children
    # Before: [("delete notes.md", None, None), ("delete ledger.db", None,
    # None)]: the second after the operator's abort of the child.
    assert ran == [("delete notes.md", "apply_patch", child.node_id)], ran
    assert "tool:apply_patch" in grant.scopes, grant.scopes


def test_rogue47b_a_computers_actions_are_gated_as_the_run_node(server, tree, gate):
    ran = []

    class Desktop(Computer):
        environment = "linux"
        dimensions = (800, 600)

        def screenshot(self) -> str:
            ran.append(_who("screenshot"))
            return "aGk="

        def click(self, x: int, y: int, button: str) -> None:
            ran.append(_who(f"click {x},{y}"))

        def double_click(self, x, y): ...
        def scroll(self, x, y, scroll_x, scroll_y): ...
        def type(self, text): ...
        def wait(self): ...
        def move(self, x, y): ...
        def keypress(self, keys): ...
        def drag(self, path): ...

    model = ScriptedModel([
        [ResponseComputerToolCall(id="cc1", call_id="c1", type="computer_call", status="completed", pending_safety_checks=[],
                                  action={"type": "click", "x": 1, "y": 2, "button": "left"})],
        [assistant_message("done")],
    ])
    tether = TetherAgents(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    triage = SDKAgent(name="triage", model=model, tools=[ComputerTool(computer=Desktop())])
    tether.run_sync(tether.agent(triage), "go")
    assert ("click 1,2", "computer_use_preview", tree.root.node_id) in ran, ran
    # Before: every action as no node, nothing in the ledger.
    assert all(node == tree.root.node_id for _, _, node in ran), ran
