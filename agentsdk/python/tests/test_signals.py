"""Agent signals over the HTTP/1.1 signal stream, and credential refresh."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import start_server
from helpers import terminate, wait_for
from tether_agentsdk import Aborted, Agent, ConnectError, Conn


def joined(server, tree, name: str) -> Agent:
    child = tree.root.spawn(name)
    a = Agent.join(server.url, child.credential)
    a.heartbeat_every = 0.5
    return a


def test_drain_is_pushed_to_events_callbacks_and_asyncio(server, tree):
    worker = joined(server, tree, "worker")
    seen: list = []
    worker.on_drain(seen.append)

    async def main():
        with worker:
            assert await asyncio.to_thread(worker.opened.wait, 10)
            waiting = asyncio.ensure_future(worker.wait_draining())
            term = await asyncio.to_thread(terminate, tree.operator, worker.node_id, "drain")
            sig = await asyncio.wait_for(waiting, 20)
            return term, sig

    term, sig = asyncio.run(main())
    assert worker.draining.is_set() and not worker.aborted.is_set()
    assert not sig.abort and sig.termination_id == term["terminationId"]
    assert seen == [sig]
    # A callback registered after the fact runs at once (signals are levels).
    late: list = []
    worker.on_drain(late.append)
    assert late == [sig]
    # Draining: the control plane refuses the agent's spawns.
    with pytest.raises(ConnectError) as e:
        worker.spawn("more")
    assert e.value.code == "failed_precondition"


def test_abort_cancels_the_agents_asyncio_work(server, tree):
    worker = joined(server, tree, "worker")
    started = threading.Event()

    async def work():
        started.set()
        await asyncio.Event().wait()  # until cancelled

    async def main():
        with worker:
            assert await asyncio.to_thread(worker.opened.wait, 10)
            task = asyncio.ensure_future(work())
            worker.cancel_on_abort(task)
            await asyncio.to_thread(started.wait, 10)
            await asyncio.to_thread(terminate, tree.operator, worker.node_id, "abort")
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 20)
            return await asyncio.wait_for(worker.wait_aborted(), 5)

    sig = asyncio.run(main())
    assert sig.abort and worker.draining.is_set()
    with pytest.raises(Aborted):
        worker.check()


def test_a_signal_is_level_triggered(server, tree):
    # The drain happens before the agent starts listening: it is told at
    # once when it does.
    child = tree.root.spawn("late")
    term = terminate(tree.operator, child.node_id, "drain")
    late = Agent.join(server.url, child.credential)
    with late:
        assert late.draining.wait(10)
    assert late.signal.termination_id == term["terminationId"]


def test_an_ancestors_termination_reaches_the_descendants(server, tree):
    worker = joined(server, tree, "worker")
    with worker:
        assert worker.opened.wait(10)
        term = terminate(tree.operator, tree.root.node_id, "drain")
        assert worker.draining.wait(20)
        assert tree.root.draining.wait(20)
    assert worker.signal.termination_id == term["terminationId"]


def test_terminated_node_is_told_and_stops(server, tree):
    worker = joined(server, tree, "worker")
    with worker:
        assert worker.opened.wait(10)
        term = terminate(tree.operator, worker.node_id, "abort", ack="1s", confirm="1s")
        assert worker.aborted.wait(20)
        # The claim is the agent's last word: confirm_exit stops its signals
        # stream and heartbeats first, so the control plane sees the session
        # end and nothing after the claim, and counts it.
        worker.confirm_exit("aborted")
        wait_for("the termination to finish", lambda: tree.operator.call(
            "SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    record = tree.operator.call("SupervisorService", "GetRecord", {"terminationId": term["terminationId"]})["record"]
    node = next(n for n in record["nodes"] if n["nodeId"] == worker.node_id)
    assert node["outcome"] == "NODE_OUTCOME_CONFIRMED", node
    assert node["confirmedBy"] == "control-plane" and "(self)" in node["claimedBy"], node
    # The credential is dead.
    with pytest.raises(ConnectError) as e:
        worker.conn.call("AgentService", "Heartbeat", {"nodeId": worker.node_id})
    assert e.value.code == "unauthenticated"


@pytest.fixture(scope="module")
def short_credentials(tether_bin, tmp_path_factory):
    s = start_server(tether_bin, tmp_path_factory.mktemp("short-credentials"), "--agent-credential-ttl", "3s")
    yield s
    s.stop()


def test_heartbeats_refresh_the_credential_before_it_expires(short_credentials):
    srv = short_credentials
    op = srv.operator()
    agent = Agent.register_root(op, "short-lived")
    first, first_expiry = agent.credential, agent.credential_expires_at
    agent.heartbeat_every = 0.2
    old = Conn(srv.url, first)
    with agent:
        # Past the first credential's expiry (and the leeway), the old one
        # is refused while the agent, refreshed, still works.
        wait_for("the first credential to be refused", lambda: _refused(old), timeout=30)
        assert agent.run_error is None
        assert agent.credential != first and agent.credential_expires_at > first_expiry
        assert agent.conn.call("AuthService", "WhoAmI", {})["nodeId"] == agent.node_id
        assert not agent.aborted.is_set()


def _refused(conn: Conn) -> bool:
    try:
        conn.call("AuthService", "WhoAmI", {})
        return False
    except ConnectError as e:
        return e.code == "unauthenticated"
