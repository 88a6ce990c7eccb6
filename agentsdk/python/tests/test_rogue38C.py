"""The thirty-eighth hostile pass on the Python SDK's Fence behind a
ToolGate, through the real server, as the Go and TypeScript SDKs' (rogue38c
tests there too): a holder's gated call is under way when its exit is
confirmed and its job goes to another agent (generation 2); the call then
attempts a side effect under its own generation 1. The fence refused it on
its own, without asking, so nothing reached the control plane and the exited
agent's record read confirmed (seen failing before the fix: no contradiction
on the former holder). Now a gated fence asks about a superseded generation
too, naming the call, and the control plane keeps it on the call's node (its
own call) as a tool call after its exit. An ungated fence still refuses it
on its own: its read would name no caller, and could frame any former
holder."""

from __future__ import annotations

import uuid

import pytest

from tether_agentsdk import Conn, Fence, Fenced, LeaseWorker, ToolGate, issued_generations


def test_rogue38C_a_former_holders_gated_side_effect_after_its_exit_is_counted(server, tree, tmp_path):
    tool = "py-rogue38c-tool-" + uuid.uuid4().hex[:6]
    conn = server.tool_server(tool)
    check = issued_generations(conn)
    asked = []

    def counting(job, generation):
        asked.append(generation)
        return check(job, generation)

    fence = Fence(check=counting)
    gate = ToolGate(conn, tool).start()
    former, nxt = tree.root.spawn("former"), tree.root.spawn("next")
    token = tree.operator.call("CapabilityService", "IssueRoot", {"holderNodeId": former.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]
    worker = LeaseWorker(Conn(server.url, former.credential), str(tmp_path / "job"), renew_every=600)
    job = None
    try:
        job_id = "py-rogue38c-" + former.node_id
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": former.node_id, "leaseDuration": "300s"})["lease"]
        job = worker.accept(offered)
        first = int(offered["leaseGeneration"])
        with pytest.raises(Fenced):
            with gate.call(token, "write"):
                Conn(server.url, former.credential).call("AgentService", "ConfirmExit", {"nodeId": former.node_id, "reason": "done, gone"})
                moved = tree.operator.call("LeaseService", "Reassign", {"jobId": job_id, "holderIdentity": nxt.node_id, "leaseDuration": "300s"})["lease"]
                fence.observe(job_id, int(moved["leaseGeneration"]))
                asked.clear()
                fence.admit(job_id, first)
        assert asked == [first], f"the gated fence asked about {asked}, want the superseded generation once"
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": former.node_id})["node"]
        kept = [c for c in node.get("contradictions", []) if "superseded" in c.get("detail", "")]
        assert len(kept) == 1 and kept[0]["kind"] == "tool_call", node.get("contradictions")

        asked.clear()
        with pytest.raises(Fenced):
            fence.admit(job_id, first)
        assert asked == [], "an ungated fence asked about a superseded generation"
    finally:
        if job is not None:
            job.stop()
        worker.close()
        gate.close()
