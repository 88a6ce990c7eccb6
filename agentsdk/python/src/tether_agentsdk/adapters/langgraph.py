"""Tether for LangGraph (``pip install 'tether-agentsdk[langgraph]'``).

::

    tether = TetherGraph(agent, gate, token=grant_tokens, grant_id=grant.grant_id)
    tools = tether.tools([lookup])                            # for a ToolNode
    researcher = tether.sub_agent("researcher", scopes=["tool:search"])
    research_graph = build(researcher.tools([search]))        # its own ToolNode
    builder.add_node("researcher", researcher.node(research_graph))
    result = await tether.ainvoke(graph, {"messages": [...]}) # cancelled on abort

- Tools: ``tools()`` returns LangChain tools that run inside the gate (the
  call is recorded; refused while the subtree drains; on abort the tool's
  task is cancelled and the cancel acknowledged once it stopped; a tool that
  returns anyway is recorded completed). ToolNode
  re-raises ToolRefused and ToolCallCancelled, so they end the run.
- Sub-agents: ``sub_agent()`` is a child node, spawned when its subgraph is
  entered (or its first tool called), holding a grant delegated from the
  run's with the given scopes; its tools present that grant. A sub-agent's
  own ``sub_agent()`` is its child, its grant delegated from its own.
- The run: ``ainvoke()``/``invoke()`` are cancelled when the Tether agent is
  aborted (the subtree's termination), raising Aborted.
"""


import asyncio
from datetime import timedelta
from typing import Any, Callable, Sequence

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.tools import tool as as_tool

from ..agent import Agent
from ..toolgate import Token, ToolGate
from ._subtree import Node, Subtree

__all__ = ["TetherGraph", "SubAgent"]


def _gated(tool: BaseTool | Callable[..., Any], gate: ToolGate, node: Node) -> BaseTool:
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)

    def run(**kwargs: Any) -> Any:
        with gate.call(node.token, base.name):
            return base.invoke(kwargs)

    async def arun(**kwargs: Any) -> Any:
        async with gate.call(node.token, base.name):
            return await base.ainvoke(kwargs)

    # A synchronous tool is left synchronous: LangChain runs it on a thread,
    # the call gated there and reported when the function has returned.
    # Gated in the run's task, the run's cancellation (its abort, the cancel
    # order) left LangChain's thread running the function and acknowledged
    # the cancel at once: the record read the call CANCELLED_ACKED while the
    # tool went on to its side effect (rogue45j test).
    return StructuredTool(name=base.name, description=base.description, args_schema=base.args_schema,
                          func=run, coroutine=None if _synchronous(base) else arun, return_direct=base.return_direct)


def _synchronous(base: BaseTool) -> bool:
    """Whether LangChain runs the tool's function on a thread: a tool with
    no coroutine of its own, or no ``_arun`` of its own."""
    if "coroutine" in type(base).model_fields:
        return getattr(base, "coroutine", None) is None
    return type(base)._arun is BaseTool._arun


class SubAgent:
    """A sub-agent of the run: a child node with a narrowed grant."""

    def __init__(self, subtree: Subtree, node: Node):
        self._subtree = subtree
        self._node = node

    @property
    def child(self):
        return self._node.child

    @property
    def grant(self):
        return self._node.grant

    def tools(self, tools: Sequence[BaseTool | Callable[..., Any]]) -> list[BaseTool]:
        """The tools as this sub-agent calls them: through the gate, with
        its grant."""
        return [_gated(t, self._subtree.gate, self._node) for t in tools]

    def sub_agent(self, name: str, *, scopes: list[str], ttl: float | timedelta = 600) -> "SubAgent":
        """A sub-agent of this one (a subgraph its graph enters): a child
        of its node, spawned after it, holding a grant delegated from its
        grant (never outliving it), so that a stop of this sub-agent
        covers it. Until the forty-sixth pass every sub-agent was the
        run's agent's child, beside the one whose graph entered it (rogue46b
        test), where the TypeScript ``tetherSubgraph`` spawns under the
        scope it is given."""
        return SubAgent(self._subtree, self._subtree.child_node(name, scopes, ttl, parent=self._node))

    def node(self, subgraph: Any) -> Callable[..., Any]:
        """A graph node running ``subgraph`` (compiled) as this sub-agent:
        the child is spawned when the node is first entered."""
        node, subtree = self._node, self._subtree

        async def run_subgraph(state: Any, config: RunnableConfig | None = None) -> Any:
            await subtree.spawned(node)
            return await subgraph.ainvoke(state, config)

        return run_subgraph


class TetherGraph:
    """Runs of a LangGraph graph under a Tether agent (started, so that its
    signals are followed) holding ``grant_id`` with ``token`` (a string or
    a callable such as Agent.token_source(grant)). ``gate`` reports with
    the tool layer's own token."""

    def __init__(self, agent: Agent, gate: ToolGate, *, token: Token, grant_id: str):
        self.subtree = Subtree(agent, gate, token, grant_id)

    @property
    def children(self):
        return list(self.subtree.children)

    def tools(self, tools: Sequence[BaseTool | Callable[..., Any]]) -> list[BaseTool]:
        """The tools as the run's own agent calls them, through the gate."""
        return [_gated(t, self.subtree.gate, self.subtree.root) for t in tools]

    def sub_agent(self, name: str, *, scopes: list[str], ttl: float | timedelta = 600) -> SubAgent:
        return SubAgent(self.subtree, self.subtree.child_node(name, scopes, ttl))

    async def ainvoke(self, graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        """graph.ainvoke, cancelled when the Tether agent is aborted (raises
        Aborted)."""
        return await self.subtree.run_cancellable(lambda: graph.ainvoke(input, config, **kwargs))

    def invoke(self, graph: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return asyncio.run(self.ainvoke(graph, input, config, **kwargs))
