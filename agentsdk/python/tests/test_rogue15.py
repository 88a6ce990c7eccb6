"""The fifteenth hostile pass, at the tool (job-lease seed 000 §7, §9,
§10, §12), for the Python SDK's Fence, through the real server: a holder
whose job the coordinator cancelled, resolved or saw completed, or that was
only offered the job, kept writing through a fence that had seen no later
generation (the check asked once per generation whether it was issued).
Now the fence refuses it (NoAuthority), as the Go and TypeScript SDKs'."""

from __future__ import annotations

import uuid

import pytest

from tether_agentsdk import CANCELLED, Conn, Fence, LeaseWorker, NoAuthority, UnissuedGeneration, issued_generations
from tether_agentsdk import _wire


def _holder(server, tree, tmp_path):
    child = tree.root.spawn("holder")
    worker = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=600)
    jobs = []

    def accept(job_id: str):
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "300s"})["lease"]
        job = worker.accept(offered)
        jobs.append(job)
        return job

    def close():
        for j in jobs:
            j.stop()
        worker.close()

    return child, accept, close


def test_a_cancelled_resolved_completed_or_offered_holder_is_refused(server, tree, tmp_path):
    child, accept, close = _holder(server, tree, tmp_path)
    fence = Fence(check=issued_generations(server.tool_server("rogue15-fenced-tool-" + uuid.uuid4().hex[:6])))
    suffix = "-" + child.node_id
    try:
        cancelled = accept("rogue15-cancelled" + suffix)
        fence.admit_headers(cancelled.headers())
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": cancelled.job_id, "reason": "stop"})
        with pytest.raises(NoAuthority, match="cancel"):
            fence.admit_headers(cancelled.headers())

        resolved = accept("rogue15-resolved" + suffix)
        fence.admit_headers(resolved.headers())
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": resolved.job_id, "reason": "stop"})
        tree.operator.call("LeaseService", "Resolve", {"jobId": resolved.job_id, "result": CANCELLED, "reason": "never confirmed"})
        with pytest.raises(NoAuthority, match="TERMINAL"):
            fence.admit_headers(resolved.headers())

        done = accept("rogue15-done" + suffix)
        fence.admit_headers(done.headers())
        done.complete(detail="done")
        with pytest.raises(NoAuthority, match="TERMINAL"):
            fence.admit_headers(done.headers())
        with pytest.raises(UnissuedGeneration):
            fence.admit(done.job_id, done.generation + 1)

        offered = tree.operator.call("LeaseService", "Offer", {"jobId": "rogue15-offered" + suffix, "holderIdentity": child.node_id, "leaseDuration": "300s"})["lease"]
        with pytest.raises(NoAuthority, match="OFFERED"):
            fence.admit("rogue15-offered" + suffix, _wire.uint64(offered["leaseGeneration"]))

        active = accept("rogue15-active" + suffix)
        fence.admit_headers(active.headers())
        fence.admit_headers(active.headers())
    finally:
        close()


def test_max_stale_trusts_an_active_answer_that_long_from_the_ask(server, tree, tmp_path):
    child, accept, close = _holder(server, tree, tmp_path)
    ask = issued_generations(server.tool_server("rogue15-stale-tool-" + uuid.uuid4().hex[:6]))
    now = [1_000_000.0]
    asks = [0]

    def counted(job: str, generation: int):
        asks[0] += 1
        return ask(job, generation)

    fence = Fence(check=counted, max_stale=10.0, clock=lambda: now[0])
    try:
        job = accept("rogue15-stale-" + child.node_id)
        fence.admit_headers(job.headers())
        fence.admit_headers(job.headers())
        assert asks[0] == 1, "an active answer within max_stale was not trusted"
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": job.job_id, "reason": "stop"})
        now[0] += 9.999
        fence.admit_headers(job.headers())  # within the stated bound
        assert asks[0] == 1
        now[0] += 0.001
        with pytest.raises(NoAuthority):
            fence.admit_headers(job.headers())
        with pytest.raises(NoAuthority):
            fence.admit_headers(job.headers())
        assert asks[0] == 3, "a refusal was kept instead of asked again"
    finally:
        close()
