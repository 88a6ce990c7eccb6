"""Seed 000 §1 and §7, read from the document alone, as they reach a user of
the Python LeaseWorker: a partition must not make two apparent owners, and
once the lease has expired its former holder has no execution authority.
The worker learnt of expiry only from an answer it could not get, so a
holder cut off from the coordinator worked on, claiming its generation, for
as long as the partition lasted. The Go SDK (agentsdk/seed_probe_test.go)
is the reference."""

from __future__ import annotations

import threading

from helpers import LOOP_RENEW_EVERY, wait_for
from tether_agentsdk import Conn, LeaseWorker
from tether_agentsdk.leaseworker import LEASE_LOST

DEAD = "http://127.0.0.1:9"  # nothing listens: every call fails unreachable


class _Counted(Conn):
    """A connection that counts the calls made on it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def call(self, *args, **kwargs):
        self.calls += 1
        return super().call(*args, **kwargs)


class ManualClock:
    """The worker's clock, in seconds, moved by the test."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, s: float) -> None:
        with self.lock:
            self.t += s


def test_a_partitioned_holder_stops_by_the_expiry_it_was_granted(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-partition-" + child.node_id
    clk = ManualClock()
    # The loop renews on every tick; the tick is also each renewal's
    # deadline, so a guard, not a time a busy machine's answers exceed
    # (0.1 s was).
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=LOOP_RENEW_EVERY, clock=clk)
    offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s"})["lease"]
    job = w.accept(offered)
    try:
        # The loop renews at 20s on the worker's clock: a window to 50s.
        clk.advance(20)
        at20 = int(job.lease.get("renewSequence", "0"))
        wait_for("two renewals after 20s", lambda: int(job.lease.get("renewSequence", "0")) >= at20 + 2)
        dead = _Counted(DEAD, child.credential, timeout=1)
        w.conn = dead  # the partition
        clk.advance(29)
        # Ticks that must not end it: two, each a renewal the partition
        # refused once its look at the bound let it renew.
        tried = dead.calls
        wait_for("two ticks at 49s", lambda: dead.calls >= tried + 2 or job.stopped.is_set())
        assert not job.stopped.is_set(), f"the job stopped at 49s, within its window ({job.cause})"
        clk.advance(1)  # 50s
        assert job.stopped.wait(20), "the partitioned job still runs past the expiry of its last accepted renewal"
        assert job.cause == LEASE_LOST and job.unconfirmed
        assert job.done.wait(20)
    finally:
        job.stop()
        w.close()


def test_a_resumed_job_renews_at_once_and_stops_without_an_answer(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-resume-" + child.node_id
    offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s"})["lease"]
    first = LeaseWorker(Conn(server.url, child.credential), str(tmp_path / "a"), renew_every=600)
    first.accept(offered).stop()  # the process is gone
    second = LeaseWorker(Conn(server.url, child.credential), str(tmp_path / "b"), renew_every=600)
    resumed = second.accept(offered)
    try:
        got = tree.operator.call("LeaseService", "GetLease", {"jobId": job_id})["lease"]
        assert got.get("renewSequence") == "1", f"the resumed job did not renew at once: {got}"
        assert not resumed.stopped.is_set(), resumed.cause
    finally:
        resumed.stop()
    # A third life whose renewal gets no answer: its ACK goes through, then
    # the network goes.
    third = LeaseWorker(Conn(server.url, child.credential), str(tmp_path / "c"), renew_every=600)
    sent = third._send

    def ack_only(kind: str, request: dict) -> dict:
        if kind != "ack":
            third.conn = Conn(DEAD, child.credential, timeout=1)
        return sent(kind, request)

    third._send = ack_only  # type: ignore[method-assign]
    lost = third.accept(offered)
    try:
        assert lost.stopped.is_set() and lost.cause == LEASE_LOST and lost.unconfirmed, lost.cause
    finally:
        lost.stop()
        first.close()
        second.close()
        third.close()
