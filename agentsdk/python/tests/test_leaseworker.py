"""LeaseWorker: ack, renew, progress, cancel and complete; the spool."""

from __future__ import annotations

import threading

from helpers import LOOP_RENEW_EVERY, wait_for
from tether_agentsdk import CANCELLED, SUCCESS, Conn, LeaseWorker, Spooled
from tether_agentsdk.leaseworker import LEASE_CANCELLED


def offer(operator: Conn, job: str, holder: str) -> dict:
    return operator.call("LeaseService", "Offer", {"jobId": job, "holderIdentity": holder, "leaseDuration": "30s"})["lease"]


def lease(operator: Conn, job: str) -> dict:
    return operator.call("LeaseService", "GetLease", {"jobId": job})["lease"]


def test_a_job_is_renewed_reports_progress_and_completes(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=LOOP_RENEW_EVERY)
    job = w.accept(offer(tree.operator, job_id, child.node_id))
    assert job.headers() == {"Tether-Job-Id": job_id, "Tether-Lease-Generation": "1"}
    wait_for("a renewal", lambda: int(lease(tree.operator, job_id).get("renewSequence", "0")) >= 1)
    assert job.progress("half")["outcome"] == "OUTCOME_ACCEPTED"
    assert job.complete(SUCCESS, "done")["outcome"] == "OUTCOME_ACCEPTED"
    assert job.stopped.is_set() and job.done.wait(10)
    assert lease(tree.operator, job_id)["terminalResult"] == "TERMINAL_RESULT_SUCCESS"
    w.close()


def test_a_cancel_request_stops_the_job_and_is_acknowledged(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-cancel-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=LOOP_RENEW_EVERY)
    seen = threading.Event()
    job = w.accept(offer(tree.operator, job_id, child.node_id), on_cancel=lambda lease: seen.set())
    tree.operator.call("LeaseService", "RequestCancel", {"jobId": job_id, "reason": "test"})
    assert job.cancelled.wait(10) and seen.is_set()
    assert job.cause == LEASE_CANCELLED
    wait_for("the cancel ack", lambda: lease(tree.operator, job_id).get("cancelAck") is True)
    job.complete(CANCELLED, "stopped on request")
    w.close()


def test_undeliverable_progress_is_spooled_and_replayed_by_a_later_worker(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-spool-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = w.accept(offer(tree.operator, job_id, child.node_id))
    # The control plane becomes unreachable for this worker.
    w.conn = Conn("http://127.0.0.1:1", child.credential, timeout=2)
    try:
        job.progress("three quarters")
        raise AssertionError("progress to an unreachable control plane was not spooled")
    except Spooled:
        pass
    assert w.pending == 1
    job.stop()
    w.close()
    # A later process on the same spool directory delivers it.
    again = LeaseWorker(Conn(server.url, child.credential), str(tmp_path))
    assert again.pending == 1
    assert again.replay() == 1 and again.pending == 0
    assert lease(tree.operator, job_id)["progressValue"] == "three quarters"
    again.close()


def test_a_job_that_lost_its_lease_never_speaks_for_the_next_generation(server, tree, tmp_path):
    # The job is reassigned to the same worker (generation 2) and accepted
    # again; the old Job learns from a stale answer that it lost the lease.
    # Its fencing headers and its late success still speak for generation 1.
    child = tree.root.spawn("worker")
    job_id = "job-zombie-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    old = w.accept(offer(tree.operator, job_id, child.node_id))
    gen2 = tree.operator.call("LeaseService", "Reassign", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s", "reason": "restart"})["lease"]
    assert old.renew()["auditEvent"] == "AUDIT_EVENT_STALE_GENERATION"
    assert old.stopped.is_set()
    current = w.accept(gen2)
    assert old.headers() == {"Tether-Job-Id": job_id, "Tether-Lease-Generation": "1"}
    assert old.complete(SUCCESS, "zombie")["auditEvent"] == "AUDIT_EVENT_STALE_GENERATION"
    assert lease(tree.operator, job_id).get("terminalResult", "TERMINAL_RESULT_UNSPECIFIED") == "TERMINAL_RESULT_UNSPECIFIED"
    assert current.headers() == {"Tether-Job-Id": job_id, "Tether-Lease-Generation": "2"}
    assert current.complete(SUCCESS, "done")["outcome"] == "OUTCOME_ACCEPTED"
    w.close()
