"""Tether for the OpenAI Agents SDK (``pip install 'tether-agentsdk[openai-agents]'``).

::

    tether = TetherAgents(agent, gate, token=grant_tokens, grant_id=grant.grant_id)
    researcher = tether.agent(researcher)                       # its tools gated
    triage = tether.agent(triage, handoffs=[tether.handoff(researcher, scopes=["tool:search"])])
    result = await tether.run(triage, "question")               # cancelled on abort

- Tools: every FunctionTool of an agent passed through ``agent()`` runs
  inside the gate (the call is recorded; refused while the subtree drains;
  on abort the tool's task is cancelled and the cancel acknowledged once it
  stopped; a tool that returns anyway is recorded completed). A refusal or cancellation fails the run with ToolRefused or
  ToolCallCancelled.
- Sub-agents: ``handoff()`` and ``subagent()`` make the target agent a
  spawned child node (spawned when the handoff is taken) whose tools present
  a grant delegated from the run's with the given scopes.
- The run: ``run()`` is cancelled when the Tether agent is aborted (the
  subtree's termination), raising Aborted.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from agents import Agent as SDKAgent
from agents import FunctionTool, Handoff, RunResult, Runner, handoff as sdk_handoff
from agents.exceptions import AgentsException

from ..agent import Aborted, Agent
from ..toolgate import Token, ToolCallCancelled, ToolGate, ToolRefused
from ._subtree import Node, Subtree

__all__ = ["TetherAgents"]


def _gated(tool: FunctionTool, gate: ToolGate, node: Node) -> FunctionTool:
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        async with gate.call(node.token, tool.name):
            return await invoke(ctx, arguments)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


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
        tools = [(_gated(t, self.subtree.gate, node) if isinstance(t, FunctionTool) else t) for t in sdk_agent.tools]
        return sdk_agent.clone(tools=tools, **overrides)

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

        return sdk_handoff(target, on_handoff=on_handoff, **handoff_kwargs)

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
