"""The thirty-sixth hostile pass on the agent SDKs' side of a stop, the
Python SDK's part: a signal callback that waits must not keep the agent
from hearing the abort that escalates its drain, and an exit claimed from
``on_drain`` must be stored. (The Go SDK ran its callbacks on the
session's reading goroutine and failed both; the Python SDK sets its
events before its callbacks and hears signals on two threads.)"""

from __future__ import annotations

import threading

from helpers import terminate, wait_for
from tether_agentsdk import Agent


def joined(server, tree, name: str) -> Agent:
    child = tree.root.spawn(name)
    a = Agent.join(server.url, child.credential)
    a.heartbeat_every = 0.5
    return a


def test_rogue36a_an_abort_reaches_an_agent_whose_drain_callback_waits(server, tree):
    worker = joined(server, tree, "rogue36a-waiting-drain")
    in_drain = threading.Event()
    release = threading.Event()  # the test's end, should the abort never come
    aborted: list = []

    def finish_in_flight(_sig) -> None:
        in_drain.set()
        while not worker.aborted.is_set() and not release.is_set():
            worker.aborted.wait(0.05)

    worker.on_drain(finish_in_flight)
    worker.on_abort(aborted.append)
    try:
        with worker:
            assert worker.opened.wait(10)
            terminate(tree.operator, worker.node_id, "drain", window="3600s")
            assert in_drain.wait(20), "the drain did not reach on_drain"
            terminate(tree.operator, worker.node_id, "abort")
            wait_for("the abort while on_drain waits", worker.aborted.is_set)
            wait_for("on_abort", lambda: bool(aborted))
            assert aborted[0].abort
    finally:
        release.set()


def test_rogue36a_an_exit_claimed_from_on_drain_is_stored(server, tree):
    worker = joined(server, tree, "rogue36a-exit-in-drain")
    claimed: list = []
    worker.on_drain(lambda _sig: claimed.append(worker.confirm_exit("drained, nothing in flight")))
    worker.start()
    try:
        assert worker.opened.wait(10)
        terminate(tree.operator, worker.node_id, "drain", window="3600s")
        wait_for("the exit claimed from on_drain", lambda: bool(claimed))
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": worker.node_id})["node"]
        assert node.get("exitedAt"), node
    finally:
        worker.close()


def test_rogue36a_callbacks_registered_after_their_signal_run(server, tree):
    # A child spawned just before its parent's stop joins into it: its
    # first word from the control plane is the signal, which can come
    # before the agent registers its callbacks. (The Go and TypeScript SDKs
    # never ran such callbacks.)
    worker = joined(server, tree, "rogue36a-late-callbacks")
    with worker:
        assert worker.opened.wait(10)
        terminate(tree.operator, worker.node_id, "abort")
        wait_for("the abort", worker.aborted.is_set)
        told: dict = {}
        worker.on_drain(lambda s: told.setdefault("drain", s))
        worker.on_abort(lambda s: told.setdefault("abort", s))
        assert told["drain"].abort and told["abort"].abort, told
