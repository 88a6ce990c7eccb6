"""The seventeenth hostile pass on the Python SDK, through the real server:
a job's lease on which the coordinator recorded an ownership conflict (a
second claimant of the active generation, from the lineage that
coordinates the job) halts execution — renewals no longer extend
authority, progress is not applied, completion is refused — and the Go and
TypeScript workers end the job on the answer that says so. The Python
worker went on: its job was neither stopped nor lost while the lease stayed
ACTIVE, so its work ran on, renewing in vain, up to the lease's expiry."""

from __future__ import annotations

from tether_agentsdk import Conn, LeaseWorker
from tether_agentsdk.leaseworker import LEASE_LOST, OWNERSHIP_CONFLICT


def test_a_recorded_ownership_conflict_halts_the_job(server, tree, tmp_path):
    planner = tree.root
    child = planner.spawn("worker")
    job_id = "job-conflict-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=600)  # renewals driven by the test
    offered = planner.conn.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "300s"})["lease"]
    job = w.accept(offered)
    try:
        # The planner claims the active generation as if it held it.
        claim = planner.conn.call("LeaseService", "Renew", {
            "jobId": job_id, "leaseId": offered["leaseId"], "leaseGeneration": offered["leaseGeneration"], "renewSequence": "1"})
        assert claim["decision"]["auditEvent"] == "AUDIT_EVENT_OWNERSHIP_CONFLICT", claim
        decision = job.renew()
        assert decision["auditEvent"] == "AUDIT_EVENT_OWNERSHIP_CONFLICT", decision
        assert job.lease.get("state") == "LEASE_STATE_ACTIVE" and job.lease.get("ownershipConflict") is True
        # The job must stop, and say why: not a lapse, not a cancel.
        assert job.stopped.is_set(), "the job runs on under a recorded ownership conflict"
        assert job.cause == OWNERSHIP_CONFLICT and job.cause != LEASE_LOST
        assert not job.cancelled.is_set()
        assert job.done.wait(10), "the renew loop goes on under the conflict"
    finally:
        job.stop()
        w.close()
