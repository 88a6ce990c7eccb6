"""The thirty-fifth hostile pass on the Python SDK's Fence, through the real
server, as the Go and TypeScript SDKs' (rogue35a tests there too): a holder
of a job lease claims its exit and goes on writing under its ACTIVE
generation at a tool whose fence asks the coordinator. The fence admitted
it until the lease's expiry (seen before the fix). Now the read says the
holder exited (holderExited), the fence refuses (NoAuthority), and the
control plane keeps the side effect on the holder as a tool call
contradicting its exit."""

from __future__ import annotations

import uuid

import pytest

from tether_agentsdk import Conn, Fence, LeaseWorker, NoAuthority, issued_generations


def test_rogue35a_an_exited_holder_is_refused_at_a_fenced_tool_and_kept(server, tree, tmp_path):
    tool = "py-rogue35a-tool-" + uuid.uuid4().hex[:6]
    fence = Fence(check=issued_generations(server.tool_server(tool)))
    rogue, honest = tree.root.spawn("rogue"), tree.root.spawn("honest")
    workers, jobs = [], []

    def accept(agent, job_id):
        worker = LeaseWorker(Conn(server.url, agent.credential), str(tmp_path / job_id), renew_every=600)
        workers.append(worker)
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": agent.node_id, "leaseDuration": "300s"})["lease"]
        job = worker.accept(offered)
        jobs.append(job)
        return job

    try:
        rogue_job = accept(rogue, "py-rogue35a-rogue-" + rogue.node_id)
        honest_job = accept(honest, "py-rogue35a-honest-" + honest.node_id)
        fence.admit_headers(rogue_job.headers())  # before its exit: admitted

        Conn(server.url, rogue.credential).call("AgentService", "ConfirmExit", {"nodeId": rogue.node_id, "reason": "done, gone"})
        with pytest.raises(NoAuthority, match="exit was confirmed"):
            fence.admit_headers(rogue_job.headers())
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": rogue.node_id})["node"]
        kept = [c for c in node.get("contradictions", []) if c.get("kind") == "tool_call" and tool in c.get("detail", "")]
        assert len(kept) == 1, node.get("contradictions")

        fence.admit_headers(honest_job.headers())  # the honest holder still writes
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": honest.node_id})["node"]
        assert not node.get("contradictions")
    finally:
        for j in jobs:
            j.stop()
        for w in workers:
            w.close()
