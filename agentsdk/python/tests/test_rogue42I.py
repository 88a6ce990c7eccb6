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

And on the gate's own threads, an asyncio call's begin refused for its
caller's lineage's spent rate budget waited out the refusal's retry hint
(the connection's Retry) there: a rogue that spent its own budget held them
a few seconds a call, every other caller's begins and reports behind it.
The hint is now waited on the caller's loop.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import NO_RETRY, require_extra, start_server

require_extra("langgraph")

from langchain_core.messages import HumanMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from tether_agentsdk import Agent, Conn, ConnectError, ToolGate, toolgate  # noqa: E402
from tether_agentsdk._connect import RESOURCE_EXHAUSTED, Retry  # noqa: E402
from tether_agentsdk.adapters.langgraph import TetherGraph  # noqa: E402

# The loop's default executor in the tests: as many threads as the rogue
# has work hanging (the default is min(32, cores + 4)).
POOL = 4


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


@pytest.fixture(scope="module")
def budgeted(tether_bin, tmp_path_factory):
    s = start_server(tether_bin, tmp_path_factory.mktemp("tether-rogue42i"), "--rate-limit", "1")
    yield s
    s.stop()


def test_rogue42I_a_rogue_refused_for_its_spent_budget_does_not_hold_the_gates_threads(budgeted, monkeypatch):
    # The gate's threads in the test: as many as the rogue's calls refused
    # at once (GATE_THREADS is 32).
    monkeypatch.setattr(toolgate, "GATE_THREADS", POOL)
    op = Conn(budgeted.url, budgeted.admin)  # the operator's setup retried through the rate limit
    rogue = Agent.register_root(op, "rogue42i-spender")
    honest = Agent.register_root(op, "rogue42i-honest-caller")
    rogue_token = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]
    honest_token = op.call("CapabilityService", "IssueRoot", {"holderNodeId": honest.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]
    minted = op.call("AuthService", "CreateToken", {"toolServer": "rogue42i-budget"})["token"]
    released = threading.Event()  # set when the test ends
    retry_waits_on_threads = []

    def wait_on_a_thread(seconds: float) -> None:
        # The connection's retry wait, as a synchronous call's: here it
        # holds its thread until the test ends, a stand-in for a rogue
        # that keeps its lineage's budget spent.
        retry_waits_on_threads.append(seconds)
        released.wait()

    retries = []  # every retry decided (its jitter drawn), wherever it waits

    def jitter() -> float:
        retries.append(1)
        return 0.0

    gate = ToolGate(Conn(budgeted.url, minted, retry=Retry(sleep=wait_on_a_thread, jitter=jitter)), "rogue42i-budget").start()
    assert gate.ready.wait(20), "the gate's cancel orders did not open"
    spender = Conn(budgeted.url, rogue.credential, retry=NO_RETRY)
    seen: dict = {}

    async def quick_tool() -> str:
        return "answered"

    async def scenario() -> None:
        # The rogue spends its own lineage's budget.
        for _ in range(100):
            try:
                spender.call("AuthService", "WhoAmI", {})
            except ConnectError as e:
                assert e.code == RESOURCE_EXHAUSTED, e
                break
        else:
            raise AssertionError("the rogue's budget was never spent; the probe tests nothing")
        rogues = [asyncio.create_task(gate.arun(rogue_token, "fetch", quick_tool)) for _ in range(3 * POOL)]
        try:
            honest_call = asyncio.create_task(gate.arun(honest_token, "echo", quick_tool))
            # Guards against the hang, not timings.
            done, _ = await asyncio.wait({honest_call}, timeout=20)
            seen["answered"] = honest_call in done and not honest_call.cancelled() and honest_call.exception() is None
            seen["retry waits"] = len(retry_waits_on_threads)
            seen["retries"] = len(retries)
        finally:
            released.set()
            for t in rogues:
                t.cancel()
        await asyncio.gather(honest_call, *rogues, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        released.set()
        gate.close()
        rogue.close()
        honest.close()
    assert seen["retries"] > 0, "the rogue's begins were never refused with a retry hint; the probe tests nothing"
    assert seen["answered"] and seen["retry waits"] == 0, (
        f"while a rogue's calls were refused for its spent budget: the honest call answered: {seen['answered']}; "
        f"retry waits made on the gate's {POOL} threads: {seen['retry waits']}")
