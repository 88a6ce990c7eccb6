"""The thirty-seventh hostile pass on the Python SDK's Fence behind a
ToolGate, through the real server, as the Go and TypeScript SDKs' (rogue37c
tests there too): an honest holder of a job lease exits; a stranger with a
token for the tool calls it with the holder's job and generation. The
fence's read named no caller, so the control plane kept the side effect on
the exited holder as a tool call contradicting its exit (seen before the
fix: one tool_call contradiction on the honest holder). Now the fence names
the gate's call (current_call()), the control plane reads the call's node
from its ledger, refuses the stranger's side effect and keeps nothing on the
holder."""

from __future__ import annotations

import uuid

import pytest

from tether_agentsdk import Conn, Fence, LeaseWorker, NoAuthority, ToolGate, current_call, issued_generations


def test_rogue37c_a_stranger_cannot_frame_an_exited_holder_through_a_gated_fence(server, tree, tmp_path):
    tool = "py-rogue37c-tool-" + uuid.uuid4().hex[:6]
    conn = server.tool_server(tool)
    fence = Fence(check=issued_generations(conn))
    gate = ToolGate(conn, tool).start()
    honest, stranger = tree.root.spawn("honest"), tree.root.spawn("stranger")

    def token_of(agent):
        return tree.operator.call("CapabilityService", "IssueRoot", {"holderNodeId": agent.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]

    honest_token, stranger_token = token_of(honest), token_of(stranger)
    worker = LeaseWorker(Conn(server.url, honest.credential), str(tmp_path / "job"), renew_every=600)
    job = None
    try:
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": "py-rogue37c-" + honest.node_id, "holderIdentity": honest.node_id, "leaseDuration": "300s"})["lease"]
        job = worker.accept(offered)
        with gate.call(honest_token, "write") as call:
            assert current_call() is call
            fence.admit_headers(job.headers())  # the holder's own side effect, before its exit

        Conn(server.url, honest.credential).call("AgentService", "ConfirmExit", {"nodeId": honest.node_id, "reason": "done, gone"})
        for _ in range(2):
            with pytest.raises(NoAuthority, match="not the holder's"):
                with gate.call(stranger_token, "write"):
                    fence.admit_headers(job.headers())
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": honest.node_id})["node"]
        assert not node.get("contradictions"), node.get("contradictions")
    finally:
        if job is not None:
            job.stop()
        worker.close()
        gate.close()


def test_rogue37c_a_call_left_out_of_order_is_no_ones_current_call(server, tree):
    # Blocks left in the order they were entered (overlapping requests
    # served on one thread) restored the context variable to a call that had
    # ended: current_call() named it, and a fence asking outside any call
    # named that ended call in its question (seen failing before the fix:
    # the first call, ended, still current).
    tool = "py-rogue37c-order-" + uuid.uuid4().hex[:6]
    gate = ToolGate(server.tool_server(tool), tool).start()
    token = tree.operator.call("CapabilityService", "IssueRoot", {"holderNodeId": tree.root.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]
    try:
        first, second = gate.call(token, "write"), gate.call(token, "write")
        a = first.__enter__()
        b = second.__enter__()
        assert current_call() is b
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
        assert current_call() is None, f"after both calls ended, current_call() is {current_call()!r} (the first: {a!r})"
    finally:
        gate.close()


@pytest.mark.parametrize("max_stale", [0, 3600])
def test_rogue37c_a_stranger_cannot_write_under_a_live_holders_lease(server, tree, tmp_path, max_stale):
    # The fence judged headers, not callers: a stranger with a token for the
    # tool wrote as the holder by naming its job and generation, and with
    # max_stale without even being asked about once the holder's own side
    # effect was admitted (seen failing before the fix: admitted).
    tool = "py-rogue37c-writer-" + uuid.uuid4().hex[:6]
    conn = server.tool_server(tool)
    fence = Fence(check=issued_generations(conn), max_stale=max_stale, clock=lambda: 0.0)
    gate = ToolGate(conn, tool).start()
    holder, stranger = tree.root.spawn("holder"), tree.root.spawn("stranger")

    def token_of(agent):
        return tree.operator.call("CapabilityService", "IssueRoot", {"holderNodeId": agent.node_id, "scopes": ["tool:*"], "ttl": "3600s"})["token"]

    holder_token, stranger_token = token_of(holder), token_of(stranger)
    worker = LeaseWorker(Conn(server.url, holder.credential), str(tmp_path / "job"), renew_every=600)
    job = None
    try:
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": f"py-rogue37c-live-{max_stale}-" + holder.node_id, "holderIdentity": holder.node_id, "leaseDuration": "300s"})["lease"]
        job = worker.accept(offered)
        with gate.call(holder_token, "write"):
            fence.admit_headers(job.headers())
        with pytest.raises(NoAuthority, match="not the holder's"):
            with gate.call(stranger_token, "write"):
                fence.admit_headers(job.headers())
        with gate.call(holder_token, "write"):
            fence.admit_headers(job.headers())  # the holder still writes
    finally:
        if job is not None:
            job.stop()
        worker.close()
        gate.close()
