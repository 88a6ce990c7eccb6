"""The sixteenth hostile pass on job leases (seed 000 §7, §9, §12), for the
Python SDK's Fence, through the real server: a fenced tool server's asks
were charged to its budget for the job a side effect named, so a rogue
caller naming another agent's job with a generation nobody was issued spent
that job's reads, and the real holder's side effects were refused until the
budget refilled. Now the fence names the generation it judges, and a read
that does not admit it is charged to the tool server's refusals, as the Go
and TypeScript SDKs'. The server's budgets are 5 requests a second in
bursts of 10: the rogue floods until its asks are refused, and the holder's
side effect follows at once."""

from __future__ import annotations

import pytest

from tether_agentsdk import Agent, ConnectError, Fence, LeaseWorker, UnissuedGeneration, issued_generations
from tether_agentsdk._connect import RESOURCE_EXHAUSTED

from conftest import start_server


@pytest.fixture(scope="module")
def budgeted(tether_bin, tmp_path_factory):
    s = start_server(tether_bin, tmp_path_factory.mktemp("tether-rogue16"), "--rate-limit", "5")
    yield s
    s.stop()


def test_a_rogue_naming_an_unissued_generation_does_not_freeze_the_holder(budgeted, tmp_path):
    op = budgeted.operator()
    holder = Agent.register_root(op, "rogue16-holder")
    worker = LeaseWorker(holder.conn, str(tmp_path), renew_every=600)
    offered = op.call("LeaseService", "Offer", {"jobId": "rogue16-frozen", "holderIdentity": holder.node_id, "leaseDuration": "300s"})["lease"]
    job = worker.accept(offered)
    try:
        fence = Fence(check=issued_generations(budgeted.tool_server("rogue16-fenced-tool")))
        fence.admit_headers(job.headers())
        refused = None
        for _ in range(200):
            try:
                fence.admit(job.job_id, job.generation + 1)
            except UnissuedGeneration:
                continue
            except ConnectError as e:
                if e.code != RESOURCE_EXHAUSTED:
                    raise
                refused = e
                break
        assert refused is not None, "the rogue's asks were never refused; the probe tests nothing"
        fence.admit_headers(job.headers())  # the holder's side effect, at once
        assert "requests refused" in refused.message, refused.message
    finally:
        job.stop()
        worker.close()
        holder.close()
