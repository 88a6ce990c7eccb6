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
  ToolCallCancelled.
- Sub-agents: ``handoff()`` and ``subagent()`` make the target agent a
  spawned child node (spawned when the handoff is taken) whose tools present
  a grant delegated from the run's with the given scopes. Every other
  handoff an agent passed through ``agent()`` carries (an agent, an SDK
  ``handoff(...)``), and those of its targets in turn, is taken the same
  way, with ``tool:<name>`` for each of the target's function tools (a
  target with none runs as the run's node); a handoff back to an agent
  already wrapped runs that agent as itself.
- The run: ``run()`` is cancelled when the Tether agent is aborted (the
  subtree's termination), raising Aborted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from datetime import timedelta
from typing import Any

from agents import Agent as SDKAgent
from agents import FunctionTool, Handoff, RunResult, Runner, handoff as sdk_handoff
from agents.exceptions import AgentsException

from ..agent import Aborted, Agent
from ..toolgate import Token, ToolCallCancelled, ToolGate, ToolRefused
from ._subtree import Node, Subtree

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

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_sync_tool if _synchronous(tool) else on_invoke_tool)


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

    def _wrap(self, sdk_agent: SDKAgent, node: Node, seen: dict | None = None, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` running as ``node``: its function tools
        gated, and every handoff it carries that Tether did not make (an
        agent, an SDK ``handoff(...)``) taken as a child node, its target
        wrapped in turn (``seen``: the targets wrapped so far in this tree
        of agents, a cycle of handoffs included). Until the forty-fifth
        pass such a handoff was kept as it was: its target's tools ran with
        no gate, as no node of the tree, recorded nowhere and not refused
        while the run drained (rogue45j tests), where the TypeScript
        adapter wraps every handoff it reaches."""
        seen = {} if seen is None else seen
        tools = [(_gated(t, self.subtree.gate, node) if isinstance(t, FunctionTool) else t) for t in sdk_agent.tools]
        handoffs = overrides.pop("handoffs", sdk_agent.handoffs)
        copy = sdk_agent.clone(tools=tools, handoffs=[], **overrides)
        copy._tether_node = node  # type: ignore[attr-defined]
        seen[id(sdk_agent)] = (sdk_agent, copy, node)
        copy.handoffs = [self._tethered_handoff(h, seen) for h in handoffs]
        return copy

    def _target(self, sdk_agent: SDKAgent, seen: dict) -> tuple[SDKAgent, Node]:
        """A handoff target Tether did not wrap, as a child node of the run
        with the scopes of its function tools (spawned when the handoff is
        taken); one the run already wraps (a cycle back, the run's own
        agent) is itself. A target with no function tools calls nothing
        the gate records and needs no grant: it runs as the node that took
        the handoff would have, the run's."""
        if getattr(sdk_agent, "_tether_node", None) is not None:
            return sdk_agent, sdk_agent._tether_node  # type: ignore[attr-defined]
        done = seen.get(id(sdk_agent))
        if done is not None:
            return done[1], done[2]
        scopes = [f"tool:{t.name}" for t in sdk_agent.tools if isinstance(t, FunctionTool)]
        node = self.subtree.child_node(sdk_agent.name, scopes) if scopes else self.subtree.root
        copy = self._wrap(sdk_agent, node, seen)
        return copy, node

    def _tethered_handoff(self, h: Any, seen: dict) -> Any:
        if getattr(h, "_tether", False):
            return h  # made by handoff(): its target is a child already
        subtree = self.subtree
        if isinstance(h, SDKAgent):
            if getattr(h, "_tether_node", None) is not None:
                return h  # a clone agent() or subagent() made: its tools gated as its node
            target, node = self._target(h, seen)

            async def on_handoff(ctx: Any) -> None:
                await subtree.spawned(node)

            made = sdk_handoff(target, on_handoff=on_handoff)
        elif isinstance(h, Handoff):
            invoke = h.on_invoke_handoff

            async def on_invoke_handoff(ctx: Any, input_json: str) -> Any:
                chosen = await invoke(ctx, input_json)
                target, node = self._target(chosen, seen)
                await subtree.spawned(node)
                return target

            made = dataclasses.replace(h, on_invoke_handoff=on_invoke_handoff)
        else:
            return h
        made._tether = True  # type: ignore[attr-defined]
        return made

    def agent(self, sdk_agent: SDKAgent, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` whose function tools run as this run's
        agent, through the gate. Keyword arguments override clone fields
        (e.g. ``handoffs=[...]``)."""
        return self._wrap(sdk_agent, self.subtree.root, **overrides)

    def subagent(self, sdk_agent: SDKAgent, *, scopes: list[str], name: str | None = None,
                 ttl: float | timedelta = 600, **overrides: Any) -> SDKAgent:
        """A clone of ``sdk_agent`` that runs as a child node (spawned on its
        first tool call) with a grant narrowed to ``scopes``. Use it as a
        handoff target or with ``as_tool``."""
        node = self.subtree.child_node(name or sdk_agent.name, scopes, ttl)
        return self._wrap(sdk_agent, node, **overrides)

    def handoff(self, sdk_agent: SDKAgent, *, scopes: list[str], name: str | None = None,
                ttl: float | timedelta = 600, **handoff_kwargs: Any) -> Handoff:
        """A handoff to ``sdk_agent`` as a child node: spawned, with its
        narrowed grant, when the model takes the handoff."""
        node = self.subtree.child_node(name or sdk_agent.name, scopes, ttl)
        target = self._wrap(sdk_agent, node)
        subtree = self.subtree

        async def on_handoff(ctx: Any) -> None:
            await subtree.spawned(node)

        made = sdk_handoff(target, on_handoff=on_handoff, **handoff_kwargs)
        made._tether = True  # type: ignore[attr-defined]
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
