"""The twenty-second hostile pass on the Python SDK: closing a LeaseWorker
from its own cancel callback (what an agent does when the operator cancels
its job: it shuts down), and the verifier's watchdog under a revocation
flood."""

from __future__ import annotations

import threading

from conftest import require_extra
from helpers import LOOP_RENEW_EVERY, FloodingFeedPeer
from tether_agentsdk import Conn, LeaseWorker
from tether_agentsdk.leaseworker import JOB_ENDED, LEASE_CANCELLED


def _offer(operator: Conn, job: str, holder: str) -> dict:
    return operator.call("LeaseService", "Offer", {"jobId": job, "holderIdentity": holder, "leaseDuration": "30s"})["lease"]


def test_close_from_the_cancel_callback_closes_the_worker(server, tree, tmp_path):
    # on_cancel runs on the job's renew thread, which close() joined: the
    # join raised RuntimeError (the on_cancel wrapper logged it), so the
    # other jobs' threads were not waited for, the spool stayed open, and a
    # second close() returned at once (the worker already marked closed).
    child = tree.root.spawn("worker")
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=LOOP_RENEW_EVERY)
    seen: dict = {}
    finished = threading.Event()

    def on_cancel(lease: dict) -> None:
        seen["thread"] = threading.current_thread()
        try:
            w.close()
            seen["error"] = None
        except Exception as e:  # noqa: BLE001 — what the test reports
            seen["error"] = e
        seen["other done"] = other.done.is_set()
        seen["spool closed"] = w._spool._f.closed
        finished.set()

    cancelled_id = "py-rogue22-cancelled-" + child.node_id
    other_id = "py-rogue22-other-" + child.node_id
    other = w.accept(_offer(tree.operator, other_id, child.node_id))
    job = w.accept(_offer(tree.operator, cancelled_id, child.node_id), on_cancel=on_cancel)
    try:
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": cancelled_id, "reason": "shut down"})
        assert finished.wait(30), "on_cancel never ran"
        assert seen["thread"] is job._thread, "on_cancel ran elsewhere than the job's renew thread"
        assert seen["error"] is None, f"close() from on_cancel raised {seen['error']!r}"
        assert seen["other done"], "close() from on_cancel returned before the worker's other job's renew thread ended"
        assert seen["spool closed"], "close() from on_cancel left the spool open"
        assert job.done.wait(30), "the cancelled job's renew thread never ended"
        assert job.cause == LEASE_CANCELLED and other.cause == JOB_ENDED, (job.cause, other.cause)
    finally:
        w.close()


_FLOOD = 500


def test_a_revocation_flood_does_not_start_a_thread_per_message(monkeypatch):
    # The feed's watchdog was a threading.Timer started anew for every
    # message: a flood of revocations started (and tore down) a thread per
    # message. One watchdog per stream now moves a deadline.
    require_extra("cryptography")
    from tether_agentsdk import Verifier

    started = []
    start = threading.Thread.start

    def counting_start(self, *args, **kwargs):
        started.append(self.name)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    peer = FloodingFeedPeer(_FLOOD)
    v = Verifier(Conn(peer.url, "rogue22-token"), offline=True, staleness_budget=30)
    try:
        v.start()
        assert v.wait_for_sequence(_FLOOD, 30), f"the verifier applied {v.head} of {_FLOOD} messages"
        # The feed thread, one watchdog for its one stream, and the peer's
        # own (its connection handler): a handful, whatever the flood.
        assert len(started) < 10, f"{len(started)} threads started for a flood of {_FLOOD} messages"
    finally:
        v.close()
        peer.close()
