"""The forty-first hostile pass on the Python SDK.

A heartbeat's answer may carry a refreshed credential, and the agent took
whatever it carried as the bearer token of every later call: one answer of
the wrong shape (a proxy's, a hostile peer's on the path to the control
plane) left the agent with a "credential" that is no token. Not text (a
number, an object), and every later heartbeat and every reconnect of the
signals stream failed before it left the process (TypeError), for good,
the path healthy again or not: the agent never heard its stop, its work
going on after it. Text a header cannot carry (a space, a line break), and
the SDK refused its own next call unauthenticated, took that for the
control plane's refusal of a dead credential and aborted the agent
itself, its heartbeats and stream stopped: a stop nobody ordered. The Go
SDK decodes the answer as a typed message (a credential that is not text
fails the message, the credential kept); the Python SDK now keeps its
credential unless the answer's is a bearer token a header can carry, as
the fortieth pass had it keep its node id (rogue40H test).

An asyncio tool server's gate began and reported each call on the loop's
default executor (``asyncio.to_thread``), the pool of a few threads
(``min(32, cores + 4)``) where the tools themselves do their blocking work
(``asyncio.to_thread``, ``run_in_executor(None, ...)``, LangChain's sync
tools): a rogue caller whose input hangs that work (a URL of a server of
its own that never answers) with as many calls as the pool has threads
held every other agent's gated calls on the server, none begun, none whose
tool had returned reported, for as long as it liked. Their callers waited,
their calls stayed in flight in the ledger, and a drain of their agents
waited for them to its deadline; an abort's cancel went unacknowledged, the
honest tool server blamed. The Go gate reports on its own goroutines; the
Python gate now runs its calls to the control plane on threads of its own.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import check_a_rewritten_credential_is_not_taken
from tether_agentsdk import Agent, Conn, ToolGate


@pytest.mark.parametrize("credential", [12345, {"credential": "a.b.c"}, "a credential\r\nX-Injected: 1"],
                         ids=["a-number", "an-object", "text-a-header-cannot-carry"])
def test_rogue41G_a_heartbeat_answer_of_the_wrong_shape_does_not_deafen_or_abort_the_agent(server, operator: Conn, credential):
    check_a_rewritten_credential_is_not_taken(server.url, operator, "rogue41g-root", credential)


# The loop's default executor in the test: as many threads as the rogue has
# calls hanging (the default is min(32, cores + 4)).
POOL = 4


def test_rogue41G_a_rogues_calls_hanging_the_loops_threads_do_not_hold_another_agents_gated_calls(server, tree):
    op = tree.operator
    rogue = Agent.register_root(op, "rogue41g-rogue")
    rogue_token = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]
    gate = ToolGate(server.tool_server("rogue41g-pool"), "rogue41g-pool").start()
    assert gate.ready.wait(10), "the gate's cancel orders did not open"
    hung = threading.Event()  # set when the test ends: the rogue's input hangs the work until then
    seen: dict = {}

    def open_calls(node_id: str) -> int:
        return len(op.call("ToolService", "ListCalls", {"nodeId": node_id}).get("calls", []))

    async def scenario() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=POOL))
        inside = asyncio.Event()
        may_return = asyncio.Event()

        async def honest_tool() -> str:
            inside.set()
            await may_return.wait()
            return "answered"

        async def quick_tool() -> str:
            return "answered"

        entered = 0
        all_entered = asyncio.Event()

        async def rogue_tool() -> None:
            nonlocal entered
            entered += 1
            if entered == POOL:
                all_entered.set()
            # Its blocking work, hung by the rogue's input: submitted to the
            # pool in this step, before the loop runs anything else.
            await asyncio.to_thread(hung.wait)

        # The honest agent's call, begun before the rogue's.
        honest = asyncio.create_task(gate.arun(tree.root_token, "echo", honest_tool))
        await inside.wait()
        rogues = [asyncio.create_task(gate.arun(rogue_token, "fetch", rogue_tool)) for _ in range(POOL)]
        await all_entered.wait()  # every thread of the pool hung by the rogue's calls
        try:
            may_return.set()
            # Guards against the hang, not timings: each call ends at once
            # unless its report waits for a thread the rogue holds.
            done, _ = await asyncio.wait({honest}, timeout=20)
            seen["first answered"] = honest in done
            # Read on the loop's own thread: the pool is the rogue's.
            seen["open in the ledger"] = open_calls(tree.root.node_id)
            second = asyncio.create_task(gate.arun(tree.root_token, "echo", quick_tool))
            done, _ = await asyncio.wait({second}, timeout=20)
            seen["second answered"] = second in done
        finally:
            hung.set()
        await asyncio.gather(honest, *rogues, return_exceptions=True)
        if not second.done():
            await asyncio.wait({second}, timeout=20)

    try:
        asyncio.run(scenario())
    finally:
        hung.set()
        gate.close()
        rogue.close()
    assert seen["first answered"] and seen["open in the ledger"] == 0 and seen["second answered"], (
        f"while a rogue's {POOL} calls hung the loop's {POOL} threads: the honest call whose tool returned answered its "
        f"caller: {seen['first answered']}, and was in flight in the ledger: {seen['open in the ledger']} call(s); "
        f"a second honest call answered: {seen['second answered']}")
