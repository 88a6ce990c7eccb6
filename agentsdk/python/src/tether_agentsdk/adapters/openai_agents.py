"""Tether for the OpenAI Agents SDK (``pip install 'tether-agentsdk[openai-agents]'``).

::

    tether = TetherAgents(agent, gate, token=grant_tokens, grant_id=grant.grant_id)
    researcher = tether.agent(researcher)                       # its tools gated
    triage = tether.agent(triage, handoffs=[tether.handoff(researcher, scopes=["tool:search"])])
    result = await tether.run(triage, "question")               # cancelled on abort

- Tools: every FunctionTool of an agent passed through ``agent()`` runs
  inside the gate (the call is recorded; refused while the subtree drains;
  on abort the tool's task is cancelled and the cancel acknowledged once it
  stopped; a tool that returns anyway is recorded completed). A synchronous
  tool is gated on the thread that runs it and reported when it returned:
  acknowledged if it stopped on ``current_call().check()``, otherwise
  completed, never acknowledged while it still runs. A refusal or cancellation fails the run with ToolRefused or
  ToolCallCancelled. A tool the SDK runs here without being a function tool
  (a local ``ShellTool``, ``LocalShellTool``, ``ApplyPatchTool``,
  ``CustomTool``, ``ComputerTool``) is gated too, each call of its executor
  one call of the tool's name (a refusal is the executor's error to the
  SDK: a shell's or editor's failed output). Hosted tools run at the
  model provider. Each tool call of an agent's MCP servers
  (``mcp_servers``) is one gated call of ``<server>/<tool>``, its grant
  checked against ``mcp:<server>/<tool>`` (``mcp_scope``); a child's
  default scopes name each server, ``mcp:<server>/*``. A ``SandboxAgent``'s
  capability tools (a ``Shell``'s ``exec_command``, a ``Filesystem``'s
  ``apply_patch``), made at run time once its capabilities are bound to the
  sandbox session, are gated as they are made, each call one call of the
  tool's name as the agent's node.
- Sub-agents: ``handoff()`` makes the target agent a child node, spawned
  when the handoff is taken under the node of the agent that took it,
  whose tools present a grant delegated from that node's with the given
  scopes (its lifetime never past that grant's). Every other handoff an
  agent passed through ``agent()`` carries (an agent, an SDK
  ``handoff(...)``), and those of its targets in turn, is taken the same
  way, with ``tool:<name>`` for each function tool of the target and of
  the agents it can hand off to (a target with none runs as the node that
  took the handoff); a handoff back to the run's agent runs it as a child
  of the agent that handed back. ``subagent()`` is a clone running as a
  child of the run's agent wherever it is reached (a handoff to it runs it
  as itself).
- The run: ``run()`` is cancelled when the Tether agent is aborted (the
  subtree's termination), raising Aborted.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import inspect
from datetime import timedelta
from typing import Any

from agents import Agent as SDKAgent
from agents import ApplyPatchTool, AsyncComputer, ComputerProvider, ComputerTool, FunctionTool, Handoff, LocalShellTool
from agents import RunResult, Runner, ShellTool, handoff as sdk_handoff
from agents.exceptions import AgentsException
from agents.mcp import MCPServer
from agents.sandbox import SandboxAgent
from agents.sandbox.capabilities import Capability, Filesystem, Memory, Shell, Skills
from agents.sandbox.capabilities.tools import ExecCommandTool, ViewImageTool, WriteStdinTool
from agents.tool import CustomTool
from pydantic import PrivateAttr

from ..agent import Aborted, Agent
from ..toolgate import Token, ToolCallCancelled, ToolGate, ToolRefused
from ._subtree import Node, Subtree, _end_unused

__all__ = ["TetherAgents"]


def _synchronous(tool: FunctionTool) -> bool:
    """Whether the SDK runs the tool's function on a thread (a synchronous
    ``@function_tool``): a cancellation stops the coroutine awaiting it,
    never the thread."""
    try:
        fn = tool.__wrapped__
    except AttributeError:  # not made by function_tool: the SDK awaits it
        return False
    return not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)))


def _gated(tool: FunctionTool, gate: ToolGate, node: Node) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        async with gate.call(node.token, tool.name):
            return await invoke(ctx, arguments)

    def run_on_its_thread(ctx: Any, arguments: str) -> Any:
        with gate.call(node.token, tool.name) as call:
            result = asyncio.run(invoke(ctx, arguments))
            if call._stopped_by_check:  # the SDK made text of it: the function stopped on the order
                raise ToolCallCancelled(call.call_id, call.reason)
            return result

    async def on_invoke_sync_tool(ctx: Any, arguments: str) -> Any:
        # The call is gated on the thread that runs the function, as a
        # synchronous tool's call is, and reported when the function has
        # returned (acknowledged only if it stopped on the order: check()).
        # Gated in the run's task, the run's cancellation (its abort, the
        # cancel order) left the SDK's thread running the function and
        # acknowledged the cancel at once: the record read the call
        # CANCELLED_ACKED and the termination ended while the tool went on
        # to its side effect (rogue45j test).
        return await asyncio.to_thread(run_on_its_thread, ctx, arguments)

    return _with(tool, on_invoke_tool=on_invoke_sync_tool if _synchronous(tool) else on_invoke_tool)


#: The SDK's tool classes, which ``dataclasses.replace`` rebuilds from
#: their fields.
_SDK_TOOLS = (FunctionTool, CustomTool, ShellTool, LocalShellTool, ApplyPatchTool, ComputerTool)


def _with(t: Any, **changes: Any) -> Any:
    """``t`` with ``changes``: ``dataclasses.replace`` for one of the SDK's
    tool classes; for a subclass, whose own ``__init__`` may take other
    arguments (a sandbox capability's ``ExecCommandTool(session=...)``,
    ``SandboxApplyPatchTool``), a copy with the changes set."""
    if type(t) in _SDK_TOOLS:
        return dataclasses.replace(t, **changes)
    made = copy.copy(t)
    for name, value in changes.items():
        setattr(made, name, value)
    return made


def _gated_run(fn: Any, gate: ToolGate, node: Node, name: str) -> Any:
    """``fn`` (an executor the SDK calls and awaits if it answers an
    awaitable) as one gated call of the tool ``name`` each time, as
    ``node``. A synchronous one runs where the SDK called it (in the run's
    task, as it did ungated), its call reported when it returned."""

    @functools.wraps(fn)  # the SDK reads the executor's signature for the keyword arguments it passes
    async def run(*args: Any, **kwargs: Any) -> Any:
        async with gate.call(node.token, name):
            out = fn(*args, **kwargs)
            return await out if inspect.isawaitable(out) else out

    return run


_COMPUTER_ACTIONS = ("screenshot", "click", "double_click", "scroll", "type", "wait", "move", "keypress", "drag")


class _Wrapping:
    """A wrapper answering what it does not define from the object it
    wraps, ``_inner``."""

    _inner: Any

    def __getattr__(self, attr: str) -> Any:
        if attr == "_inner":
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class _GatedComputer(_Wrapping, AsyncComputer):
    """A computer (``Computer`` or ``AsyncComputer``) whose every action is
    one gated call of the computer tool."""

    def __init__(self, inner: Any, gate: ToolGate, node: Node, name: str):
        self._inner = inner
        for action in _COMPUTER_ACTIONS:
            setattr(self, action, _gated_run(getattr(inner, action), gate, node, name))

    @property
    def environment(self) -> Any:
        return self._inner.environment

    @property
    def dimensions(self) -> Any:
        return self._inner.dimensions

    # Shadowed per instance by the gated actions __init__ sets.
    async def screenshot(self) -> str: raise NotImplementedError  # noqa: E704
    async def click(self, x: int, y: int, button: Any) -> None: raise NotImplementedError  # noqa: E704
    async def double_click(self, x: int, y: int) -> None: raise NotImplementedError  # noqa: E704
    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> None: raise NotImplementedError  # noqa: E704
    async def type(self, text: str) -> None: raise NotImplementedError  # noqa: E704
    async def wait(self) -> None: raise NotImplementedError  # noqa: E704
    async def move(self, x: int, y: int) -> None: raise NotImplementedError  # noqa: E704
    async def keypress(self, keys: list[str]) -> None: raise NotImplementedError  # noqa: E704
    async def drag(self, path: list[tuple[int, int]]) -> None: raise NotImplementedError  # noqa: E704


def _gated_computer(config: Any, gate: ToolGate, node: Node, name: str) -> Any:
    """A computer tool's ``computer`` (an instance, an initializer, or a
    provider) answering computers whose actions are gated; a provider's
    ``dispose`` is handed the computer its ``create`` made."""

    def gated(c: Any) -> Any:
        return c if isinstance(c, _GatedComputer) else _GatedComputer(c, gate, node, name)

    def creating(create: Any) -> Any:
        async def made(**kwargs: Any) -> Any:
            c = create(**kwargs)
            return gated(await c if inspect.isawaitable(c) else c)
        return made

    if isinstance(config, ComputerProvider) or (not isinstance(config, AsyncComputer) and callable(getattr(config, "create", None))
                                                 and not callable(getattr(config, "screenshot", None))):
        dispose = config.dispose

        def disposing(*, computer: Any, **kwargs: Any) -> Any:
            return dispose(computer=getattr(computer, "_inner", computer), **kwargs)

        return ComputerProvider(create=creating(config.create), dispose=None if dispose is None else disposing)
    if callable(config) and not callable(getattr(config, "screenshot", None)):
        return creating(config)
    return gated(config)


def _gated_local(t: Any, gate: ToolGate, node: Node) -> Any:
    """A tool the SDK runs in this process that is not a function tool (a
    local shell, an apply_patch editor, a custom tool, a computer), its
    executor's each call one gated call of the tool's name as ``node``; or
    None for a tool run at the model provider (a hosted tool). Until the
    forty-seventh pass each was kept as it was: a model steered into the
    shell ran its commands, the editor its deletions, as no node of the
    tree, recorded nowhere, needing no scope, not refused while the run
    drained nor after an operator aborted the child that ran them (rogue47b
    tests), as the TypeScript adapter's ``gateTool`` left them too."""
    if isinstance(t, ShellTool):
        return None if t.executor is None else _with(t, executor=_gated_run(t.executor, gate, node, t.name))
    if isinstance(t, LocalShellTool):
        return _with(t, executor=_gated_run(t.executor, gate, node, t.name))
    if isinstance(t, ApplyPatchTool):
        editor = t.editor
        gated = type("GatedEditor", (), {
            op: staticmethod(_gated_run(getattr(editor, op), gate, node, t.name))
            for op in ("create_file", "update_file", "delete_file")})()
        return _with(t, editor=gated)
    if isinstance(t, CustomTool):
        return _with(t, on_invoke_tool=_gated_run(t.on_invoke_tool, gate, node, t.name))
    if isinstance(t, ComputerTool):
        return _with(t, computer=_gated_computer(t.computer, gate, node, t.name))
    return None


#: A sandbox capability's class, made once for each capability class, whose
#: ``tools()`` answers its tools as the node holding it calls them.
_GATING_CAPABILITIES: dict[type, type] = {}


def _gating(cls: type) -> type:
    made = _GATING_CAPABILITIES.get(cls)
    if made is None:
        class Gating(cls):  # type: ignore[valid-type, misc]
            # Set on each instance (kept by the runtime's per-run clone,
            # model_copy, never copied deeper): ``node``'s ``_tool``.
            _tether_tool: Any = PrivateAttr(default=None)

            def tools(self) -> list[Any]:
                tools = super().tools()
                return tools if self._tether_tool is None else [self._tether_tool(t) for t in tools]

        Gating.__name__ = Gating.__qualname__ = cls.__name__
        Gating._tether_base = cls  # type: ignore[attr-defined]
        _GATING_CAPABILITIES[cls] = made = Gating
    return made


def _capability_tools(capability: Capability) -> list[str]:
    """The names of the tools one of the SDK's sandbox capabilities makes
    once bound to a session (before, it makes none: ``tools()`` raises), for
    a child's default scopes. A capability of the application's own, or one
    whose ``configure_tools`` renames its tools, is not known here: its
    calls need scopes given (``handoff(scopes=...)``), refused otherwise."""
    if isinstance(capability, Shell):
        return [ExecCommandTool.tool_name, WriteStdinTool.tool_name]
    if isinstance(capability, Filesystem):
        return [ViewImageTool.tool_name, "apply_patch"]
    if isinstance(capability, Skills) and capability.lazy_from is not None:
        return ["load_skill"]
    return []


def _gated_capability(capability: Capability, tool: Any, agent: str) -> Capability:
    """A sandbox agent's ``capability`` (a ``Shell``, a ``Filesystem``, any
    ``Capability``) whose tools, made at run time once the runner has bound
    the capability to its sandbox session, are each ``tool(t)``: gated as
    the node of the agent holding it. The same class (a subclass of the
    capability's, made once), its fields and private state as they were.

    A ``Memory`` that generates memories is refused: when the sandbox
    session stops (the run's end, its drain's or abort's included) the SDK
    runs agents of its own, sandbox agents with its default capabilities (a
    shell, an editor) whose model reads the run's transcript, which the
    run's model wrote; no Tether node runs them and nothing can gate them.
    Kept, a run drained for its commands had the memory agent run one on
    the host after the drain (rogue48d test)."""
    if isinstance(capability, Memory) and capability.generate is not None:
        raise ValueError(
            f"tether: sandbox agent {agent!r} has Memory(generate=...), whose memory agents run shell and file "
            f"tools in the sandbox, steered by the run's transcript, as no node of the tree, after the run and "
            f"its stop; give it Memory(generate=None) (reads only) and generate memories outside the tether")
    cls = _gating(getattr(type(capability), "_tether_base", type(capability)))
    made = capability.model_copy()
    object.__setattr__(made, "__class__", cls)
    object.__setattr__(made, "__pydantic_private__", {**(made.__pydantic_private__ or {}), "_tether_tool": tool})
    return made


def mcp_scope(server: str, tool: str = "*") -> str:
    """The scope of the tool ``tool`` an agent's MCP server named
    ``server`` serves, ``mcp:<server>/<tool>``, as the MCP gateway
    (``agentsdk/mcpgate``) names an upstream's tools; ``mcp:<server>/*``
    covers every tool the server lists, whenever it lists it."""
    return f"mcp:{server}/{tool}"


class _GatedMCPServer(_Wrapping, MCPServer):
    """An agent's MCP server whose every tool call (the SDK lists the
    server's tools at run time and calls ``call_tool`` for each one the
    model asks for) is one gated call of the tool ``<server>/<tool>`` as
    ``node``, its grant checked against ``mcp:<server>/<tool>``. Everything
    else (connecting, listing, the server's approval and guardrail
    settings) is the server's own: connect and clean up the server given,
    as before."""

    def __init__(self, inner: MCPServer, gate: ToolGate, node: Node):  # noqa: D107 (the inner server was initialised)
        self._inner, self._gate, self._node = inner, gate, node

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def cached_tools(self) -> Any:
        return self._inner.cached_tools

    async def connect(self) -> Any:
        return await self._inner.connect()

    async def cleanup(self) -> Any:
        return await self._inner.cleanup()

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> Any:
        return await self._inner.list_tools(run_context, agent)

    async def list_prompts(self) -> Any:
        return await self._inner.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self._inner.get_prompt(name, arguments)

    async def list_resources(self, cursor: str | None = None) -> Any:
        return await self._inner.list_resources(cursor)

    async def list_resource_templates(self, cursor: str | None = None) -> Any:
        return await self._inner.list_resource_templates(cursor)

    async def read_resource(self, uri: str) -> Any:
        return await self._inner.read_resource(uri)

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None) -> Any:
        server = self._inner.name
        async with self._gate.call(self._node.token, f"{server}/{tool_name}", required_scope=mcp_scope(server, tool_name)):
            if meta is None:
                return await self._inner.call_tool(tool_name, arguments)
            return await self._inner.call_tool(tool_name, arguments, meta=meta)


def _gated_mcp_server(server: MCPServer, gate: ToolGate, node: Node) -> MCPServer:
    """``server`` as ``node``'s agent holds it: each tool call gated
    (``_GatedMCPServer``), the server given unwrapped first if another
    node's agent held it."""
    return _GatedMCPServer(getattr(server, "_inner", server), gate, node)


def _gates_locally(t: Any) -> bool:
    """Whether ``t`` runs here, gated, without being a function tool."""
    return isinstance(t, (LocalShellTool, ApplyPatchTool, CustomTool, ComputerTool)) or (
        isinstance(t, ShellTool) and t.executor is not None)


def _reach(sdk_agent: SDKAgent) -> list[str]:
    """``tool:<name>`` for each function tool of ``sdk_agent`` (and
    ``mcp:<server>/*`` for each of its MCP servers, whose tools are listed
    only at run time, and ``tool:<name>`` for each tool a sandbox agent's
    capabilities make at run time, ``_capability_tools``) and of every
    agent it can hand off to, and they in turn (a ``handoff()``'s scopes
    for its target; a clone Tether bound to a node runs as that node and
    needs none): what its child node delegates on to the children it
    spawns, which the control plane refuses to widen. With its own tools'
    alone, a handoff its target took was refused (scope escalation)."""
    scopes: list[str] = []
    seen: set[int] = set()
    todo = [sdk_agent]
    while todo:
        a = todo.pop(0)
        if id(a) in seen:
            continue
        seen.add(id(a))
        for t in a.tools:
            if (isinstance(t, FunctionTool) or _gates_locally(t)) and f"tool:{t.name}" not in scopes:
                scopes.append(f"tool:{t.name}")
        for t in a.tools:
            spec = getattr(t, "_tether_agent_tool", None)
            if spec is not None and spec[2] is not None:
                scopes += [s for s in spec[2] if s not in scopes]
            elif spec is not None:
                todo.append(spec[0])
        for server in a.mcp_servers:
            if mcp_scope(server.name) not in scopes:
                scopes.append(mcp_scope(server.name))
        if isinstance(a, SandboxAgent):
            for c in a.capabilities:
                scopes += [f"tool:{n}" for n in _capability_tools(c) if f"tool:{n}" not in scopes]
        for h in a.handoffs:
            spec = getattr(h, "_tether_spec", None)
            if spec is not None:
                scopes += [s for s in spec[1] if s not in scopes]
                continue
            if isinstance(h, Handoff):
                ref = getattr(getattr(h, "_tether_plain", h), "_agent_ref", None)
                h = ref() if ref is not None else None
            if isinstance(h, SDKAgent) and getattr(h, "_tether_node", None) is None:
                todo.append(h)
    return scopes


class TetherAgents:
    """One run of OpenAI agents under a Tether agent (started, so that its
    signals are followed) holding ``grant_id`` with ``token`` (a string or
    a callable such as Agent.token_source(grant)). ``gate`` reports with the
    tool layer's own token."""

    def __init__(self, agent: Agent, gate: ToolGate, *, token: Token, grant_id: str):
        self.subtree = Subtree(agent, gate, token, grant_id)

    @property
    def children(self):
        """(Child, Grant) of every sub-agent spawned so far."""
        return list(self.subtree.children)

    def _wrap(self, sdk_agent: SDKAgent, node: Node, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` running as ``node``: its function tools
        gated, and every handoff it carries taken as a child of ``node``
        (``_tethered_handoff``). Until the forty-fifth pass a handoff
        Tether did not make was kept as it was: its target's tools ran with
        no gate, as no node of the tree, recorded nowhere and not refused
        while the run drained (rogue45j tests), where the TypeScript
        adapter wraps every handoff it reaches."""
        tools = [self._tool(t, node) for t in sdk_agent.tools]
        handoffs = overrides.pop("handoffs", sdk_agent.handoffs)
        servers = [_gated_mcp_server(s, self.subtree.gate, node) for s in overrides.pop("mcp_servers", sdk_agent.mcp_servers)]
        if isinstance(sdk_agent, SandboxAgent):
            # Its capabilities' tools (a shell's exec_command, apply_patch)
            # are made at run time, bound to the sandbox session, after the
            # tools above were gated: each is gated as it is made.
            overrides["capabilities"] = [_gated_capability(c, functools.partial(self._tool, node=node), sdk_agent.name)
                                         for c in overrides.get("capabilities", sdk_agent.capabilities)]
        copy = sdk_agent.clone(tools=tools, handoffs=[], mcp_servers=servers, **overrides)
        copy._tether_node = node  # type: ignore[attr-defined]
        copy.handoffs = [self._tethered_handoff(h, node) for h in handoffs]
        return copy

    def _tool(self, t: Any, node: Node) -> Any:
        """``t`` as ``node`` calls it: a function tool gated; an agent tool
        ``agent_tool()`` made running its agent as a child of ``node``.
        An agent tool the SDK made (``as_tool``) of an agent Tether did not
        bind to a node is refused: it would run that agent's tools inside
        its one gated call, ungated (no node, nothing in the ledger, no
        scope, not refused while the run drains: rogue46b tests)."""
        if not isinstance(t, FunctionTool):
            gated = _gated_local(t, self.subtree.gate, node)
            return t if gated is None else gated
        spec = getattr(t, "_tether_agent_tool", None)
        if spec is not None:
            made = _gated(self._agent_tool_as(t, spec, node), self.subtree.gate, node)
            made._tether_agent_tool = spec  # type: ignore[attr-defined]  # wrapped again: bound again
            return made
        if getattr(t, "_is_agent_tool", False) and getattr(getattr(t, "_agent_instance", None), "_tether_node", None) is None:
            inner = getattr(getattr(t, "_agent_instance", None), "name", "?")
            raise ValueError(
                f"tether: tool {t.name!r} runs agent {inner!r} (as_tool), whose tools would run ungated inside "
                f"it; make it with TetherAgents.agent_tool({inner}, ...) (a child of the agent calling it) or "
                f"subagent({inner}, ...).as_tool(...)")
        return _gated(t, self.subtree.gate, node)

    def _agent_tool_as(self, t: FunctionTool, spec: tuple, node: Node) -> FunctionTool:
        """The agent tool ``agent_tool()`` made, called by ``node``: each
        call spawns its agent as a child of ``node`` (``_taken``'s scopes)
        and runs the SDK's own agent tool (``as_tool``, with the arguments
        given) of the agent wrapped for that child."""
        sdk_agent, name, scopes, ttl, as_tool_kwargs = spec
        subtree = self.subtree

        async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
            inner, child = self._taken(sdk_agent, node, None if scopes is None else (name, scopes, ttl))
            await subtree.spawned(child)
            return await inner.as_tool(**as_tool_kwargs).on_invoke_tool(ctx, arguments)

        return _with(t, on_invoke_tool=on_invoke_tool)

    def _taken(self, chosen: SDKAgent, taker: Node, spec: tuple | None) -> tuple[SDKAgent, Node]:
        """The agent a handoff taken by ``taker`` runs: one Tether already
        bound to a node (a clone ``agent()`` or ``subagent()`` made) as
        itself; any other as a child of ``taker``, with ``spec``'s name,
        scopes and ttl (``handoff()``'s) or ``tool:<name>`` for each
        function tool of it and of the agents it can hand off to in turn
        (``_reach``), wrapped afresh for that child, its own handoffs taken
        under it. A target with none calls nothing the gate records and
        needs no grant: it runs as ``taker``. Until the forty-sixth pass
        every such child was the run's agent's, whoever took the handoff,
        and a handoff back to the run's agent ran it as the run's node
        (rogue46b tests): the TypeScript adapter's ``tetherAgent``
        spawns it under the node that took the handoff."""
        if getattr(chosen, "_tether_node", None) is not None:
            return chosen, chosen._tether_node  # type: ignore[attr-defined]
        if spec is not None:
            name, scopes, ttl = spec
            node = self.subtree.child_node(name or chosen.name, scopes, ttl, parent=taker)
        else:
            scopes = _reach(chosen)
            node = self.subtree.child_node(chosen.name, scopes, parent=taker) if scopes else taker
        return self._wrap(chosen, node), node

    def _tethered_handoff(self, h: Any, taker: Node) -> Any:
        """``h`` as a handoff ``taker`` takes: when taken, its target runs
        as ``_taken`` says (spawned first). An agent is made an SDK
        ``handoff(...)`` first; one ``handoff()`` made keeps its scopes."""
        if isinstance(h, SDKAgent):
            if getattr(h, "_tether_node", None) is not None:
                return h  # a clone agent() or subagent() made: its tools gated as its node
            h = sdk_handoff(h)
        if not isinstance(h, Handoff):
            return h
        spec = getattr(h, "_tether_spec", None)
        plain = getattr(h, "_tether_plain", h)
        invoke = plain.on_invoke_handoff
        subtree = self.subtree

        async def on_invoke_handoff(ctx: Any, input_json: str) -> Any:
            # The target an SDK handoff() names is spawned before the
            # handoff's own invoke, which runs the application's on_handoff
            # with the model's input: run first, a handoff taken after its
            # taker's drain (or abort) ran it, the spawn refused only after
            # (rogue48d test), where the TypeScript adapter spawns first.
            ref = getattr(plain, "_agent_ref", None)
            named = ref() if ref is not None else None
            if named is not None:
                target, node = self._taken(named, taker, spec)
                await subtree.spawned(node)
            try:
                chosen = await invoke(ctx, input_json)
            except Exception:
                # The handoff failed (its on_handoff refused it, the model's
                # input did not parse): a child spawned for it never runs,
                # and is ended as one refused its grant is, lest the next
                # termination's record count it unaccounted.
                if named is not None and node is not taker and getattr(named, "_tether_node", None) is None and node.child is not None:
                    await subtree.gate._in_thread(functools.partial(_end_unused, node.child, subtree.agent.conn))
                raise
            if chosen is not named:  # a Handoff of the application's own, its target known now
                target, node = self._taken(chosen, taker, spec)
                await subtree.spawned(node)
            return target

        made = dataclasses.replace(plain, on_invoke_handoff=on_invoke_handoff)
        made._tether = True  # type: ignore[attr-defined]
        made._tether_plain = plain  # type: ignore[attr-defined]
        made._tether_spec = spec  # type: ignore[attr-defined]
        return made

    def agent(self, sdk_agent: SDKAgent, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` whose function tools run as this run's
        agent, through the gate. Keyword arguments override clone fields
        (e.g. ``handoffs=[...]``)."""
        return self._wrap(sdk_agent, self.subtree.root, **overrides)

    def subagent(self, sdk_agent: SDKAgent, *, scopes: list[str], name: str | None = None,
                 ttl: float | timedelta = 600, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` that runs as a child node of the run's
        agent (spawned on its first tool call) with a grant narrowed to
        ``scopes``. Use it as a handoff target or with ``as_tool``."""
        node = self.subtree.child_node(name or sdk_agent.name, scopes, ttl)
        return self._wrap(sdk_agent, node, **overrides)

    def handoff(self, sdk_agent: SDKAgent, *, scopes: list[str], name: str | None = None,
                ttl: float | timedelta = 600, **handoff_kwargs: Any) -> Handoff:
        """A handoff to ``sdk_agent`` as a child node: spawned, with its
        narrowed grant, when the model takes the handoff, under the node of
        the agent that took it (one passed through ``agent()``, or reached
        from it; on its own, under the run's agent)."""
        plain = sdk_handoff(sdk_agent, **handoff_kwargs)
        plain._tether_spec = (name, scopes, ttl)  # type: ignore[attr-defined]
        return self._tethered_handoff(plain, self.subtree.root)

    def agent_tool(self, sdk_agent: SDKAgent, *, scopes: list[str] | None = None, name: str | None = None,
                   ttl: float | timedelta = 600, **as_tool_kwargs: Any) -> FunctionTool:
        """``sdk_agent.as_tool(**as_tool_kwargs)`` for an agent passed
        through ``agent()`` (or reached from one): each call runs
        ``sdk_agent`` as a child of the node of the agent calling it,
        spawned for the call, with ``scopes`` (default ``tool:<name>`` for
        each function tool of it and of the agents it reaches), its tools
        gated as that child, so that a drain or abort of the caller's
        subtree stops them. An SDK ``as_tool`` of an agent Tether did not
        wrap is refused by ``agent()``: it ran the agent's tools ungated
        inside its one gated call (rogue46b tests)."""
        made = sdk_agent.as_tool(**as_tool_kwargs)
        made._tether_agent_tool = (sdk_agent, name, scopes, ttl, as_tool_kwargs)  # type: ignore[attr-defined]
        return made

    async def run(self, starting_agent: SDKAgent, input: Any, **runner_kwargs: Any) -> RunResult:
        """Runner.run, cancelled when the Tether agent is aborted (raises
        Aborted)."""
        try:
            return await self.subtree.run_cancellable(lambda: Runner.run(starting_agent, input, **runner_kwargs))
        except AgentsException as e:
            # The SDK wraps what a tool raised; Tether's verdicts surface as
            # themselves.
            if isinstance(e.__cause__, (ToolRefused, ToolCallCancelled, Aborted)):
                raise e.__cause__ from e
            raise

    def run_sync(self, starting_agent: SDKAgent, input: Any, **runner_kwargs: Any) -> RunResult:
        return asyncio.run(self.run(starting_agent, input, **runner_kwargs))
