"""The forty-fourth hostile pass on the Python SDK's LeaseWorker (letter A):
the Go and TypeScript workers' fix of the forty-third pass
(TestRogue43VLeaseWorker*, rogue43S.test.ts) brought to Python. A rogue
path to the control plane (a proxy that replays, caches or crosses
answers) stands in front of the real server and answers one job's
messages with another job's answers, or with another lease of the job.

A job judged an answer by its generation and state only. Generations
count per job (every job's first is 1), so another job's answer of the
same generation passed for the job's own: another job's accepted renewal
moved the job's bound and replaced its ``lease`` (it worked on with no
renewal of its own accepted), and another job's cancel request had the job
run its ``on_cancel`` and acknowledge a cancel the coordinator never asked
of it. An answer whose lease names another job, or another lease of the
job, is now taken for nothing and stops the job (cause LEASE_LOST, its
``detail`` naming the ids the answer carried, clipped).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from datetime import datetime, timezone
from typing import Callable

from conftest import NO_RETRY
from helpers import LoopbackPeer, QuietHandler
from tether_agentsdk import Conn, LeaseWorker
import pytest

from tether_agentsdk.leaseworker import LEASE_CANCELLED, LEASE_LOST

FORGED = "lease-44a-forged"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

# How the path answers a message of the own job: given the method, the
# real answer and the last real answer to the same method for another
# job, the answer to relay (None: the real one).
Swap = Callable[[str, dict, "dict | None"], "dict | None"]


class CrossingPath(LoopbackPeer):
    """A relay on loopback in front of the real server (the path between a
    worker and its control plane). It relays every request; it keeps the
    last answer to each lease method for any job but ``own``, and answers
    the own job's as ``swap`` says. It counts the own job's renewals and
    cancel acknowledgements."""

    def __init__(self, upstream: str, own: str):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.own = own
        self.lock = threading.Lock()
        self.swap: Swap | None = None
        self.others: dict[str, dict] = {}
        self.renewals = 0
        self.cancel_acks = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                up = self.forward(peer.upstream, body)
                if "LeaseService" not in self.path:
                    self.relay_answer(up)
                    return
                resp = up.getresponse()
                data = resp.read()
                up.close()
                try:
                    job = json.loads(body).get("jobId")
                except ValueError:
                    job = None
                if resp.status == 200:
                    real = json.loads(data)
                    with peer.lock:
                        if job != peer.own:
                            peer.others[method] = real
                        else:
                            if method == "Renew":
                                peer.renewals += 1
                            if method == "CancelAck":
                                peer.cancel_acks += 1
                            if peer.swap is not None:
                                swapped = peer.swap(method, real, peer.others.get(method))
                                if swapped is not None:
                                    data = json.dumps(swapped).encode()
                self.answer_whole(resp, data)

        self.serve(Handler)

    def set_swap(self, swap: Swap | None) -> None:
        with self.lock:
            self.swap = swap

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.renewals, self.cancel_acks


def other_jobs(method: str) -> Swap:
    """The path answers the own job's ``method`` with another job's last answer to it."""
    def swap(m: str, real: dict, other: dict | None) -> dict | None:
        if m != method:
            return None
        assert other is not None, f"no other job's answer to {method} to cross: the test proves nothing"
        return other
    return swap


def forged_duration(method: str, duration: str) -> Swap:
    """The path answers the own job's ``method`` with its real answer, another lease duration in it."""
    def swap(m: str, real: dict, other: dict | None) -> dict | None:
        if m != method or not isinstance(real.get("lease"), dict):
            return None
        return {**real, "lease": {**real["lease"], "leaseDuration": duration}}
    return swap


def forged_lease(method: str) -> Swap:
    """The path answers the own job's ``method`` with its real answer, another lease id in it."""
    def swap(m: str, real: dict, other: dict | None) -> dict | None:
        if m != method or not isinstance(real.get("lease"), dict):
            return None
        return {**real, "lease": {**real["lease"], "leaseId": FORGED}}
    return swap


class World:
    """A child agent holding two jobs of generation 1 on the real server
    through the rogue path: the own job under a LeaseWorker (whose renew
    thread waits an hour: the test's renewals are its own), the other
    ACKed by hand."""

    def __init__(self, server, tree, tmp_path, name: str, *, ack_swap: Swap | None = None,
                 lease_duration: str = "600s", renew_every: float | None = 3600):
        self.tree = tree
        child = tree.root.spawn("rogue44a-" + name)
        self.own_id = f"job-44a-{name}-own-{child.node_id}"
        self.other_id = f"job-44a-{name}-other-{child.node_id}"
        self.path = CrossingPath(server.url, self.own_id)
        self.conn = Conn(self.path.url, child.credential, retry=NO_RETRY)

        def offer(job_id: str) -> dict:
            return tree.operator.call("LeaseService", "Offer", {
                "jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": lease_duration})["lease"]

        self.own, self.other = offer(self.own_id), offer(self.other_id)
        assert self.own["leaseGeneration"] == self.other["leaseGeneration"], "generations differ: the test proves nothing"
        self.conn.call("LeaseService", "Ack", {
            "jobId": self.other_id, "leaseId": self.other["leaseId"], "leaseGeneration": self.other["leaseGeneration"],
            "sentAt": now()})
        self.on_cancels = 0
        self.worker = LeaseWorker(self.conn, str(tmp_path), renew_every=renew_every)
        self.path.set_swap(ack_swap)

        def on_cancel(_lease: dict) -> None:
            self.on_cancels += 1

        self.job = self.worker.accept(self.own, on_cancel=on_cancel)
        self.path.set_swap(None)

    def call_other(self, method: str, **extra: str) -> dict:
        """Sends the other job's ``method`` by hand through the path, which keeps the answer."""
        return self.conn.call("LeaseService", method, {
            "jobId": self.other_id, "leaseId": self.other["leaseId"], "leaseGeneration": self.other["leaseGeneration"],
            "sentAt": now(), **extra})

    def check_lost(self, what: str, names: str) -> None:
        """The job stopped as lost, naming what the answer named, and kept its own lease."""
        job = self.job
        renewals, _ = self.path.counts()
        assert job.stopped.is_set(), f"the job ran on after answers with {what} lease ({renewals} renewal(s) answered so)"
        assert job.cause == LEASE_LOST and not job.unconfirmed, f"the job stopped with {job.cause}, want {LEASE_LOST}"
        assert job.detail is not None and "the answer names " + names in job.detail, \
            f"the job's detail {job.detail!r} does not name {names}"
        assert job.lease.get("jobId") == self.own_id and job.lease.get("leaseId") == self.own["leaseId"], \
            f"the job keeps job {job.lease.get('jobId')!r} lease {job.lease.get('leaseId')!r} as its own"

    def close(self) -> None:
        self.worker.close()
        self.path.close()


def renew_twice_and_check_lost(world: World, what: str, names: str) -> None:
    """Renews the job twice (unless it stops at the first), and checks it
    stopped as lost at the first answer, that of what (check_lost)."""
    for _ in range(2):
        if world.job.stopped.is_set():
            break
        world.job.renew()
    world.check_lost(what, names)
    renewals, _ = world.path.counts()
    assert renewals == 1, f"{renewals} renewals sent, want 1: the job ran on after an answer that was not its own"


def test_rogue44a_lease_worker_takes_no_other_jobs_renewal(server, tree, tmp_path):
    """Another job's accepted renewal of the same generation, replayed for
    the job's: it stops the job as lost, and its lease is not taken."""
    w = World(server, tree, tmp_path, "renew")
    try:
        w.call_other("Renew", renewSequence="1")
        w.path.set_swap(other_jobs("Renew"))
        renew_twice_and_check_lost(w, "another job's", f'job "{w.other_id}"')
    finally:
        w.close()


def test_rogue44a_lease_worker_takes_no_other_leases_renewal(server, tree, tmp_path):
    """The job's own answer with another lease of the job in it: it stops
    the job as lost, and that lease is not taken."""
    w = World(server, tree, tmp_path, "lease")
    try:
        w.path.set_swap(forged_lease("Renew"))
        renew_twice_and_check_lost(w, "another lease's", f'lease "{FORGED}"')
    finally:
        w.close()


def test_rogue44a_lease_worker_runs_no_other_jobs_cancel(server, tree, tmp_path):
    """Another job's cancel request, replayed for the job's renewal: the
    job runs no on_cancel and acknowledges nothing, and stops as lost."""
    w = World(server, tree, tmp_path, "cancel")
    try:
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": w.other_id, "reason": "rogue44a"})
        assert w.call_other("Renew", renewSequence="1")["lease"].get("cancelRequested"), \
            "the other job's answer carries no cancel request: the test proves nothing"
        w.path.set_swap(other_jobs("Renew"))
        w.job.renew()
        _, acks = w.path.counts()
        assert (w.on_cancels, acks) == (0, 0), \
            f"another job's cancel request ran on_cancel {w.on_cancels} time(s) and was acknowledged {acks} time(s) " \
            "for the job; want 0 and 0"
        assert not w.job.cancelled.is_set(), "the job heard another job's cancel request as its own"
        w.check_lost("another job's", f'job "{w.other_id}"')
        lease = tree.operator.call("LeaseService", "GetLease", {"jobId": w.own_id})["lease"]
        assert not lease.get("cancelRequested") and not lease.get("cancelAck"), \
            f"the coordinator's lease of the job: cancel requested {lease.get('cancelRequested')}, acknowledged {lease.get('cancelAck')}"
    finally:
        w.close()


def test_rogue44a_lease_worker_runs_no_other_jobs_cancel_from_progress(server, tree, tmp_path):
    """Another job's answer to a progress report carrying its cancel
    request, replayed for the job's: as for a renewal."""
    w = World(server, tree, tmp_path, "progress")
    try:
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": w.other_id, "reason": "rogue44a"})
        assert w.call_other("Progress", progressSequence="1", progressValue="1")["lease"].get("cancelRequested"), \
            "the other job's answer carries no cancel request: the test proves nothing"
        w.path.set_swap(other_jobs("Progress"))
        w.job.progress("1")
        _, acks = w.path.counts()
        assert (w.on_cancels, acks) == (0, 0), \
            f"another job's cancel request ran on_cancel {w.on_cancels} time(s) and was acknowledged {acks} time(s) " \
            "for the job; want 0 and 0"
        w.check_lost("another job's", f'job "{w.other_id}"')
    finally:
        w.close()


def test_rogue44a_lease_worker_takes_no_other_leases_ack(server, tree, tmp_path):
    """The answer to the job's ACK with another lease of the job in it: the
    job stops as lost before it begins, and that lease is not taken."""
    w = World(server, tree, tmp_path, "ack", ack_swap=forged_lease("Ack"))
    try:
        w.check_lost("another lease's", f'lease "{FORGED}"')
        assert w.job.done.wait(10), "the job's renew thread did not end"
        renewals, _ = w.path.counts()
        assert renewals == 0, f"{renewals} renewals sent after an ACK answer that was not the job's own, want 0"
    finally:
        w.close()


def test_rogue44a_lease_worker_keeps_its_lease_on_another_leases_complete(server, tree, tmp_path):
    """The answer to the job's result with another lease of the job in it:
    the job keeps its own lease (the Go and TypeScript workers' rule)."""
    w = World(server, tree, tmp_path, "complete")
    try:
        w.path.set_swap(forged_lease("Complete"))
        w.job.complete()
        lease = w.job.lease
        assert lease.get("jobId") == w.own_id and lease.get("leaseId") == w.own["leaseId"], \
            f"the job keeps job {lease.get('jobId')!r} lease {lease.get('leaseId')!r} as its own"
    finally:
        w.close()


@pytest.mark.parametrize("duration", ["86400s", "315576000000s"], ids=["a-day", "the-largest"])
def test_rogue44a_a_forged_lease_duration_does_not_deafen_the_job(server, tree, tmp_path, duration):
    """The answer to the job's ACK with a longer lease duration in it than
    the one the coordinator fixed for the generation (the offer's): the
    worker renewed every third of it (a day's: every 8 hours; the largest
    a duration holds: its renew thread died at once, the wait too long for
    the platform) and took it for the job's window, so the job, its path
    honest from then on, never renewed again within its lease, never heard
    its cancel request, and worked on past the lease's expiry at the
    coordinator for as long. The job's lease duration is now the offer's;
    an answer's longer one is not taken."""
    w = World(server, tree, tmp_path, "duration-" + duration.rstrip("s")[-4:], ack_swap=forged_duration("Ack", duration),
              lease_duration="6s", renew_every=None)
    try:
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": w.own_id, "reason": "rogue44a"})
        # A guard against the deaf job (ten of its renew intervals), not a
        # timing. The renew thread ends once it acted on the answer (its
        # on_cancel run, the request acknowledged).
        heard = w.job.stopped.wait(20) and w.job.done.wait(20)
        renewals, acks = w.path.counts()
        assert heard, f"the job never heard its cancel request: {renewals} renewal(s) sent in 20 s of a 6 s lease, " \
                      f"its renew thread {'dead' if w.job.done.is_set() else 'waiting'}"
        assert w.job.cause == LEASE_CANCELLED, f"the job stopped with {w.job.cause} ({w.job.detail}), want {LEASE_CANCELLED}"
        assert (w.on_cancels, acks) == (1, 1), f"on_cancel ran {w.on_cancels} time(s), the cancel acknowledged {acks} time(s); want 1 and 1"
    finally:
        w.close()
