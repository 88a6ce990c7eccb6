"""The thirty-seventh hostile pass on the agent SDKs' side of a stop, the
Python SDK's part: a drained agent is told until when (the control plane
never set SessionSignal.deadline: ``Signal.deadline`` was always None), and
follows the deadline of the stop that holds it, not its first drain's."""

from __future__ import annotations

import threading
from datetime import timedelta

from helpers import terminate, wait_for
from tether_agentsdk import Agent, _wire


def test_rogue37a_a_rogue_parents_day_long_drain_does_not_hide_the_operators_shorter_one(server, tree):
    child = Agent.join(server.url, tree.root.spawn("rogue37a-child").credential)
    child.heartbeat_every = 0.5
    with child:
        assert child.opened.wait(10)
        asked = terminate(tree.root.conn, child.node_id, "drain", window="86400s", confirm="86400s")
        wait_for("the parent's drain deadline", lambda: child.drain_deadline is not None, timeout=60)
        parents = child.drain_deadline
        assert parents > _wire.parse_timestamp(asked["requestedAt"]) + timedelta(hours=1), parents
        asked = terminate(tree.operator, child.node_id, "drain", window="60s", confirm="60s")
        wait_for("the operator's earlier deadline",
                 lambda: child.drain_deadline is not None and child.drain_deadline < parents, timeout=60)
        assert child.drain_deadline < _wire.parse_timestamp(asked["requestedAt"]) + timedelta(hours=1), child.drain_deadline


def test_rogue37a_a_waiting_drain_callback_holds_neither_the_signals_nor_the_heartbeats(server, tree):
    # The SDK ran on_drain on the thread that heard the drain, its signals
    # stream's or its heartbeats': a callback that waits for the work in
    # flight held it, and when it was the heartbeats' no heartbeat went out
    # and the credential was not refreshed for the drain's length (past the
    # credential's last third, the SDK then aborted the agent itself).
    worker = Agent.join(server.url, tree.root.spawn("rogue37a-waiting-drain").credential)
    worker.heartbeat_every = 0.5
    ran_on: list[str] = []
    release = threading.Event()

    def finish_in_flight(_sig) -> None:
        ran_on.append(threading.current_thread().name)
        release.wait(60)

    worker.on_drain(finish_in_flight)
    try:
        with worker:
            assert worker.opened.wait(10)
            terminate(tree.operator, worker.node_id, "drain", window="3600s", confirm="3600s")
            wait_for("on_drain", lambda: bool(ran_on))
            assert not ran_on[0].startswith(("tether-signals-", "tether-heartbeat-")), \
                f"on_drain ran on the SDK's {ran_on[0]} thread, which it holds while it waits"
    finally:
        release.set()
