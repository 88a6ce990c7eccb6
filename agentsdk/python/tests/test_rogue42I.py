"""The forty-second hostile pass on the Python SDK: what still ran on an
asyncio loop's default executor.

The forty-first pass took the gate's begins and reports off the loop's
default executor, the few threads (``min(32, cores + 4)``) where the tools'
own blocking work runs (``asyncio.to_thread``, ``run_in_executor(None,
...)``, LangChain's sync tools), which a rogue whose input hangs that work
(a URL of a server of its own that never answers) holds for as long as it
likes. Two things stayed there. The adapters' lazy spawn of a sub-agent
(a LangGraph subgraph entered, an OpenAI Agents handoff taken): another
agent's run in the process entered its subgraph and waited behind the
rogue's hung work, its child never spawned, its run going nowhere (its drain
held to the deadline, its exit never claimed). And ``async with agent``'s
end, the agent's ``close()``: an honest agent whose work had ended left its
block and waited there, its heartbeats going on and its signals stream,
the control plane's witness of its exit, never closed. Both now run on
threads that are not the loop's default executor: the spawn on the gate's
own (``GATE_THREADS``), ``close()`` on a thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import require_extra

require_extra("langgraph")

from langchain_core.messages import HumanMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from tether_agentsdk import Agent, ToolGate  # noqa: E402
from tether_agentsdk.adapters.langgraph import TetherGraph  # noqa: E402

# The loop's default executor in the tests: as many threads as the rogue
# has work hanging (the default is min(32, cores + 4)).
POOL = 4


@pytest.fixture
def gate(server):
    name = "r42i-gate-" + uuid.uuid4().hex[:8]
    g = ToolGate(server.tool_server(name), name).start()
    assert g.ready.wait(10), "the gate's cancel orders did not open"
    yield g
    g.close()


def hang_the_default_executor(hung: threading.Event) -> list[asyncio.Future]:
    """POOL tasks of the rogue's, each with its blocking work (hung until
    ``hung`` is set) on the loop's default executor of POOL threads; returns
    once every thread is taken."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=POOL))
    started = threading.Semaphore(0)

    def rogue_work() -> None:
        started.release()
        hung.wait()

    # Submitted at once (run_in_executor(None, ...), as asyncio.to_thread).
    rogues = [loop.run_in_executor(None, rogue_work) for _ in range(POOL)]
    for _ in range(POOL):
        # On the loop's thread: the pool is the rogue's.
        assert started.acquire(timeout=20), "the rogue's work did not start"
    return rogues


def test_rogue42I_a_rogues_hung_default_executor_does_not_hold_another_agents_subgraph_spawn(server, tree, gate):
    tether = TetherGraph(tree.root, gate, token=tree.root_token, grant_id=tree.root_grant_id)
    researcher = tether.sub_agent("researcher", scopes=["tool:search"])

    async def research(state: MessagesState):
        return {"messages": [HumanMessage(content="researched")]}

    sub = StateGraph(MessagesState)
    sub.add_node("research", research)
    sub.add_edge(START, "research")
    sub.add_edge("research", END)
    builder = StateGraph(MessagesState)
    builder.add_node("researcher", researcher.node(sub.compile()))
    builder.add_edge(START, "researcher")
    builder.add_edge("researcher", END)
    graph = builder.compile()

    hung = threading.Event()
    seen: dict = {}

    async def scenario() -> None:
        try:
            rogues = hang_the_default_executor(hung)
            run = asyncio.create_task(tether.ainvoke(graph, {"messages": [HumanMessage(content="go")]}))
            # Guards against the hang, not timings: the run spawns its
            # child and ends at once unless it waits for a thread the
            # rogue holds.
            done, _ = await asyncio.wait({run}, timeout=20)
            seen["run ended"] = run in done
            seen["child spawned"] = researcher.child is not None
        finally:
            hung.set()
        await asyncio.gather(run, *rogues, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        hung.set()
    assert seen["run ended"] and seen["child spawned"], (
        f"while a rogue's work hung the loop's {POOL} default threads: the honest run that entered its subgraph ended: "
        f"{seen['run ended']}; its sub-agent spawned: {seen['child spawned']}")


def test_rogue42I_async_with_agent_closes_while_a_rogue_holds_the_default_executor(server, tree):
    honest = Agent.register_root(tree.operator, "rogue42i-honest")
    honest.heartbeat_every = 0.5
    hung = threading.Event()
    seen: dict = {}

    async def scenario() -> None:
        threads: list[threading.Thread] = []

        async def work() -> None:
            async with honest:
                threads.extend(honest._threads)
                # Its signals stream open: on the loop's thread, a bound on the wait.
                assert honest.opened.wait(20), "the honest agent's signals stream did not open"
            # Its work done: the block left, the agent closed.

        try:
            rogues = hang_the_default_executor(hung)
            task = asyncio.create_task(work())
            # Guards against the hang, not timings.
            done, _ = await asyncio.wait({task}, timeout=20)
            seen["block left"] = task in done
            seen["heartbeats and stream still running"] = sum(t.is_alive() for t in threads)
        finally:
            hung.set()
        await asyncio.gather(task, *rogues, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        hung.set()
        honest.close()
    assert seen["block left"] and seen["heartbeats and stream still running"] == 0, (
        f"while a rogue's work hung the loop's {POOL} default threads: the honest agent's `async with` block was left: "
        f"{seen['block left']}; its threads still running (heartbeats, signals stream): "
        f"{seen['heartbeats and stream still running']}")
