"""The forty-third hostile pass on the Python SDK's side of a stop: the
SDK's own ways of telling asyncio code about a stop (``cancel_on_abort``,
which the adapters' runs use, ``wait_aborted``, ``wait_draining`` and the
loop events) were on_abort / on_drain callbacks like any other, run one
after another on one thread in the order registered. A callback of the
agent's registered before them that waits (its cleanup, hung on a tool
server that never answers; an on_drain that waits for the work in flight,
as on_drain's documentation allows) held them: the run was never
cancelled on its abort, and the code awaiting its drain never heard it.
The Go SDK ends ``Agent.Context`` at once, before its callbacks run."""

from __future__ import annotations

import asyncio
import threading

from helpers import terminate, wait_for
from tether_agentsdk import Aborted, Agent
from tether_agentsdk.adapters._subtree import Subtree

# A bound on a wait that the fix ends at once, and that without it never
# ends: a guard, not a timing.
GUARD = 20.0


def test_rogue43H_a_hung_abort_cleanup_does_not_keep_the_run_going_after_its_abort(server, tree):
    worker = Agent.join(server.url, tree.root.spawn("rogue43H-hung-cleanup").credential)
    worker.heartbeat_every = 0.5
    cleanup_began = threading.Event()
    tool_server_answers = threading.Event()  # a tool server of the rogue's: it never answers

    def cleanup(_sig) -> None:
        # Registered first, as an agent sets up its cleanup before its runs.
        cleanup_began.set()
        tool_server_answers.wait()

    worker.on_abort(cleanup)
    steps_after_abort: list[int] = []

    async def run() -> str:
        ran = asyncio.Event()  # nothing sets it: the run works until stopped
        subtree = Subtree(worker, None, "unused", "unused")  # type: ignore[arg-type]

        async def work() -> str:
            n = 0
            while True:
                if worker.aborted.is_set():
                    steps_after_abort.append(n)
                n += 1
                try:
                    await asyncio.wait_for(ran.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass

        async def abort_it() -> None:
            await asyncio.to_thread(terminate, tree.operator, worker.node_id, "abort", window="3600s", ack="3600s", confirm="3600s")
            await asyncio.to_thread(wait_for, "the abort's cleanup", cleanup_began.is_set)

        running = asyncio.ensure_future(subtree.run_cancellable(work))
        await abort_it()
        done, _ = await asyncio.wait({running}, timeout=GUARD)
        if not done:
            running.cancel()
            return "still running"
        try:
            running.result()
        except Aborted:
            return "aborted"
        return "returned"

    with worker:
        assert worker.opened.wait(10)
        try:
            outcome = asyncio.run(run())
        finally:
            tool_server_answers.set()  # before close(), which waits for the cleanup
        assert outcome == "aborted", (
            f"the run {outcome} after its abort, {len(steps_after_abort)} steps taken since, while the agent's cleanup "
            "waited on a tool server")


def test_rogue43H_a_waiting_drain_callback_does_not_deafen_the_run_to_its_drain(server, tree):
    worker = Agent.join(server.url, tree.root.spawn("rogue43H-waiting-drain").credential)
    worker.heartbeat_every = 0.5
    in_flight_done = threading.Event()
    waiting_began = threading.Event()

    def finish_in_flight(_sig) -> None:
        # What on_drain's documentation allows: wait for the work in flight.
        waiting_began.set()
        in_flight_done.wait()

    worker.on_drain(finish_in_flight)

    async def run() -> str:
        heard = asyncio.ensure_future(worker.wait_draining())
        await asyncio.to_thread(terminate, tree.operator, worker.node_id, "drain", window="3600s", confirm="3600s")
        await asyncio.to_thread(wait_for, "the drain's callback", waiting_began.is_set)
        done, _ = await asyncio.wait({heard}, timeout=GUARD)
        if not done:
            heard.cancel()
            return "not heard"
        # The work in flight ends once it heard its drain.
        in_flight_done.set()
        return "heard"

    with worker:
        assert worker.opened.wait(10)
        try:
            outcome = asyncio.run(run())
        finally:
            in_flight_done.set()
        assert outcome == "heard", f"the drain was {outcome} by the run {GUARD}s after its on_drain began waiting for the run"


def test_rogue43H_runs_and_given_up_waits_leave_nothing_registered(server, tree):
    # Each run of the adapters registered its task's cancel with the agent
    # for good (and so kept the task and its result), and each wait given
    # up (``asyncio.wait_for(agent.wait_draining(), ...)``, a poll) its
    # event: an agent serving runs for long held every one, and its stop
    # walked them all before the run in progress was told.
    worker = Agent.join(server.url, tree.root.spawn("rogue43H-many-runs").credential)
    runs = 200

    async def serve() -> None:
        subtree = Subtree(worker, None, "unused", "unused")  # type: ignore[arg-type]

        async def one() -> str:
            return "x" * 1024

        for _ in range(runs):
            await subtree.run_cancellable(one)
            try:
                await asyncio.wait_for(worker.wait_draining(), 0.001)
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(0)  # the done callbacks of the last run

    asyncio.run(serve())
    held = len(worker._on_abort) + len(worker._on_drain) + len(getattr(worker, "_abort_hooks", ())) + len(getattr(worker, "_drain_hooks", ()))
    assert held == 0, f"{held} hooks held after {runs} runs and as many given-up waits, none of them running"
