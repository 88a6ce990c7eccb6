"""The seeds' promises (job leases, termination) as they reach a user of the
Python SDK, played through a real tether server. The Go SDK
(agentsdk/leaseworker.go, fence.go, toolgate.go) is the reference."""

from __future__ import annotations

import threading

import pytest

from conftest import NO_RETRY, start_server
from helpers import terminate, tool_calls, wait_for
from tether_agentsdk import CANCELLED, SUCCESS, Agent, ConnectError, Conn, LeaseWorker, Spooled, ToolCallCancelled, ToolGate, ToolRefused, current_call, tool_gate
from tether_agentsdk.leaseworker import LEASE_CANCELLED, LEASE_LOST


def offer(operator: Conn, job: str, holder: str) -> dict:
    return operator.call("LeaseService", "Offer", {"jobId": job, "holderIdentity": holder, "leaseDuration": "30s"})["lease"]


def lease(operator: Conn, job: str) -> dict:
    return operator.call("LeaseService", "GetLease", {"jobId": job})["lease"]


def test_fencing_headers_are_the_ones_the_go_fence_reads(server, tree, tmp_path):
    child = tree.root.spawn("seed-headers")
    job_id = "seed-py-headers-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = w.accept(offer(tree.operator, job_id, child.node_id))
    # agentsdk.HeaderJobID, agentsdk.HeaderLeaseGeneration
    assert job.headers() == {"Tether-Job-Id": job_id, "Tether-Lease-Generation": "1"}
    job.complete(SUCCESS, "done")
    w.close()


def test_a_cancel_stops_the_work_and_is_acknowledged_once(server, tree, tmp_path):
    child = tree.root.spawn("seed-cancel")
    job_id = "seed-py-cancel-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    seen = []
    job = w.accept(offer(tree.operator, job_id, child.node_id), on_cancel=lambda l: seen.append(l["jobId"]))
    tree.operator.call("LeaseService", "RequestCancel", {"jobId": job_id, "reason": "seed"})
    job.renew()
    assert job.cancelled.is_set() and job.stopped.is_set() and job.cause == LEASE_CANCELLED
    assert seen == [job_id]
    assert lease(tree.operator, job_id).get("cancelAck") is True
    job.renew()
    assert seen == [job_id], "on_cancel runs once"
    assert job.complete(CANCELLED, "stopped on request")["outcome"] == "OUTCOME_ACCEPTED"
    assert lease(tree.operator, job_id)["terminalResult"] == "TERMINAL_RESULT_CANCELLED"
    assert job.done.wait(10)
    w.close()


def test_a_generation_it_no_longer_holds_reports_nothing_that_counts(server, tree, tmp_path):
    child = tree.root.spawn("seed-fence")
    job_id = "seed-py-fence-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    old = w.accept(offer(tree.operator, job_id, child.node_id))
    gen2 = tree.operator.call("LeaseService", "Reassign", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s", "reason": "restart"})["lease"]
    current = w.accept(gen2)
    current.progress("current")
    p = old.progress("zombie")
    assert p["outcome"] == "OUTCOME_REJECTED" and p["auditEvent"] == "AUDIT_EVENT_STALE_GENERATION"
    assert old.stopped.is_set() and old.cause == LEASE_LOST
    assert old.complete(SUCCESS, "zombie")["auditEvent"] == "AUDIT_EVENT_STALE_GENERATION"
    got = lease(tree.operator, job_id)
    assert got["progressValue"] == "current"
    assert got.get("terminalResult", "TERMINAL_RESULT_UNSPECIFIED") == "TERMINAL_RESULT_UNSPECIFIED"
    current.complete(SUCCESS, "done")
    w.close()


def test_a_restarted_worker_goes_on_from_the_accepted_sequences(server, tree, tmp_path):
    # A worker process killed after it renewed and reported progress comes
    # back and accepts the job it still holds (the ACK is a DUPLICATE). Its
    # sequences used to start at 0 again: its renewals were refused
    # STALE_RENEW until the lease lapsed, its reports kept as late progress.
    child = tree.root.spawn("seed-restart")
    job_id = "seed-py-restart-" + child.node_id
    offered = offer(tree.operator, job_id, child.node_id)
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = w.accept(offered)
    for step in ("1", "2", "3"):
        assert job.renew()["outcome"] == "OUTCOME_ACCEPTED"
        assert job.progress("step " + step)["outcome"] == "OUTCOME_ACCEPTED"
    job.stop()  # the process is gone
    w.close()
    again = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = again.accept(offered)
    renewed = job.renew()
    assert renewed["outcome"] == "OUTCOME_ACCEPTED", renewed.get("reason")
    reported = job.progress("step 4")
    assert reported["outcome"] == "OUTCOME_ACCEPTED", reported.get("reason")
    got = lease(tree.operator, job_id)
    # (accept renewed at once, seq 4: a repeated ACK proves no window.)
    assert (got.get("renewSequence"), got.get("progressSequence"), got.get("progressValue"), got.get("lateProgress", False)) == ("5", "4", "step 4", False)
    job.complete(SUCCESS, "done")
    again.close()


def test_a_restarted_worker_learns_of_a_cancel_from_its_ack(server, tree, tmp_path):
    # The coordinator cancelled while the worker process was down; the
    # restarted worker's ACK is a DUPLICATE carrying cancel_requested. The
    # job used to start regardless, and heard of the cancel only from its
    # first renewal's answer.
    child = tree.root.spawn("seed-restart-cancel")
    job_id = "seed-py-restart-cancel-" + child.node_id
    offered = offer(tree.operator, job_id, child.node_id)
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    w.accept(offered).stop()  # the process is gone
    w.close()
    tree.operator.call("LeaseService", "RequestCancel", {"jobId": job_id, "reason": "stop"})
    again = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    seen = []
    job = again.accept(offered, on_cancel=lambda l: seen.append(l["jobId"]))
    stopped = job.cancelled.is_set() and job.stopped.is_set() and job.cause == LEASE_CANCELLED
    if not stopped:
        job.stop()
    assert stopped, f"the restarted job: cause {job.cause}"
    assert seen == [job_id]
    assert lease(tree.operator, job_id).get("cancelAck") is True
    assert job.complete(CANCELLED, "stopped on request")["outcome"] == "OUTCOME_ACCEPTED"
    again.close()


def test_a_replayed_result_is_the_same_result_and_detail(server, tree, tmp_path):
    # The result could not be delivered: it waits in the spool and a later
    # worker replays it. Sent again by hand, the same result and detail is
    # an exact repeat (DUPLICATE); a different detail is refused.
    child = tree.root.spawn("seed-replay")
    job_id = "seed-py-replay-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = w.accept(offer(tree.operator, job_id, child.node_id))
    w.conn = Conn("http://127.0.0.1:1", child.credential, timeout=2)
    with pytest.raises(Spooled):
        job.complete(SUCCESS, "42 rows")
    w.close()
    again = LeaseWorker(Conn(server.url, child.credential), str(tmp_path))
    assert again.replay() == 1 and again.pending == 0
    got = lease(tree.operator, job_id)
    assert got["terminalResult"] == "TERMINAL_RESULT_SUCCESS" and got["terminalDetail"].endswith(": 42 rows")
    same = again._send("complete", {**job._claim(), "result": SUCCESS, "detail": "42 rows"})["decision"]
    assert same["outcome"] == "OUTCOME_DUPLICATE" and same["auditEvent"] == "AUDIT_EVENT_DUPLICATE_TERMINAL"
    other = again._send("complete", {**job._claim(), "result": SUCCESS, "detail": "43 rows"})["decision"]
    assert other["outcome"] == "OUTCOME_REJECTED"
    assert lease(tree.operator, job_id)["terminalDetail"].endswith(": 42 rows")
    again.close()


def test_draining_refuses_new_calls_and_lets_the_call_in_flight_finish(server, tree, gate):
    child = tree.root.spawn("seed-drain")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:*"], ttl=600)
    started, release = threading.Event(), threading.Event()
    out: list = []

    def held():
        with tool_gate(gate, "held", token=grant.token):
            started.set()
            release.wait(30)
        out.append("held done")

    t = threading.Thread(target=held)
    t.start()
    assert started.wait(10)
    tid = terminate(tree.operator, child.node_id, "drain", confirm="2s")["terminationId"]
    ran = []
    with pytest.raises(ToolRefused) as e:
        gate.run(grant.token, "fresh", lambda: ran.append(True))
    assert e.value.draining and not ran
    release.set()
    t.join(30)
    assert out == ["held done"]
    wait_for("the termination's end", lambda: tree.operator.call("SupervisorService", "GetTermination", {"terminationId": tid})["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    by_tool = {c["tool"]: c["resolution"] for c in tool_calls(tree.operator, tid)}
    assert by_tool == {"held": "CALL_RESOLUTION_COMPLETED", "fresh": "CALL_RESOLUTION_REJECTED_DRAINING"}


def test_aborting_acknowledges_only_the_call_it_really_cancelled(server, tree, gate):
    child = tree.root.spawn("seed-abort")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:*"], ttl=600)
    started = threading.Barrier(3)
    out: dict = {}

    def stops():
        try:
            with tool_gate(gate, "stops", token=grant.token) as call:
                started.wait(10)
                call.cancelled.wait(30)
                call.check()
        except ToolCallCancelled as e:
            out["stops"] = e

    def finishes():
        with tool_gate(gate, "finishes", token=grant.token) as call:
            started.wait(10)
            call.cancelled.wait(30)
        out["finishes"] = "side effect done"

    ts = [threading.Thread(target=stops), threading.Thread(target=finishes)]
    for t in ts:
        t.start()
    started.wait(10)
    tid = terminate(tree.operator, child.node_id, "abort", confirm="2s")["terminationId"]
    for t in ts:
        t.join(30)
    assert isinstance(out.get("stops"), ToolCallCancelled) and out.get("finishes") == "side effect done"
    wait_for("the termination's end", lambda: tree.operator.call("SupervisorService", "GetTermination", {"terminationId": tid})["termination"]["state"] == "TERMINATION_STATE_TERMINATED")
    by_tool = {c["tool"]: (c["resolution"], bool(c.get("acknowledgedBy"))) for c in tool_calls(tree.operator, tid)}
    assert by_tool == {"stops": ("CALL_RESOLUTION_CANCELLED_ACKED", True), "finishes": ("CALL_RESOLUTION_COMPLETED", False)}


def test_a_rate_limit_refusal_reaches_the_caller_as_resource_exhausted(tether_bin, tmp_path):
    # Its own server, with a budget small enough to spend.
    s = start_server(tether_bin, tmp_path, "--rate-limit", "3")
    try:
        op = s.operator()
        root = Agent.register_root(op, "seed-rate")
        g = op.call("CapabilityService", "IssueRoot", {"holderNodeId": root.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        # A lease report refused for rate (the agent lineage's budget) is not
        # taken for an answer: like the Go worker, it goes to the spool and
        # the caller gets Spooled, whose cause is the refusal.
        # Its connection retries nothing: the refusal, not the SDK's retry of it.
        w = LeaseWorker(Conn(s.url, root.credential, retry=NO_RETRY), str(tmp_path / "spool"), renew_every=60)
        job = w.accept(offer(op, "seed-py-rate", root.node_id))
        spooled = None
        for i in range(200):
            try:
                job.progress(f"step {i}")
            except Spooled as e:
                spooled = e
                break
        job.stop()
        assert spooled is not None, "200 reports at 3/s were never refused"
        assert isinstance(spooled.__cause__, ConnectError) and spooled.__cause__.code == "resource_exhausted", repr(spooled.__cause__)
        assert w.pending == 1
        w.close()
        gate = ToolGate(s.tool_server("seed-rate-gate"), "seed-rate-gate")
        ran = []
        refusal = None
        for _ in range(200):
            try:
                gate.run(g["token"], "search", lambda: ran.append(True))
            except ConnectError as e:
                refusal = e
                break
        assert refusal is not None, "200 calls at 3/s were never refused"
        assert refusal.code == "resource_exhausted" and not isinstance(refusal, ToolRefused), repr(refusal)
        assert "rate limit" in refusal.message
    finally:
        s.stop()


def test_a_call_its_caller_cancelled_without_an_order_is_failed_not_acknowledged(server, tree, gate):
    import asyncio

    child = tree.root.spawn("seed-noorder")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:*"], ttl=600)
    recorded: list = []
    answers: list = []
    real_call = gate.conn.call

    def seen(service, method, req, *a, **kw):  # the real call; keeps the ledger's answer
        resp = real_call(service, method, req, *a, **kw)
        if method in ("EndCall", "CancelAck"):
            answers.append((method, resp["call"]))
        return resp

    gate.conn.call = seen

    async def main():
        started = asyncio.Event()

        async def tool():
            async with tool_gate(gate, "noorder", token=grant.token) as call:
                recorded.append(call.call_id)
                started.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(tool())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (call_id,) = recorded
    # The control plane refused the acknowledgement (no order): the gate ended it failed.
    assert [(m, c["callId"], c["resolution"], bool(c.get("acknowledgedBy"))) for m, c in answers] == [
        ("EndCall", call_id, "CALL_RESOLUTION_FAILED", False)]
