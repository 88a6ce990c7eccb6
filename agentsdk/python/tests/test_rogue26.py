"""The twenty-sixth hostile pass on the Python SDK: what the SDK does when
the control plane says no to an agent being stopped."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from helpers import LOOP_RENEW_EVERY, terminate, wait_for
from tether_agentsdk import Agent, ConnectError, ToolGate, ToolRefused, tool_gate


def test_a_token_source_refused_by_the_stop_is_a_refused_call(server, tree):
    """docs/integrating.md's agent catches ToolRefused — "refused while
    stopping, or its grant already revoked by the stop" — waits for the
    stop's signal and confirms its exit. A gated call whose token source
    must refresh (a third of the token's life left, as every token comes to)
    asks the control plane, which refuses the stopped agent's grant: that
    refusal escaped as a bare ConnectError, so the documented agent died on
    its stop without confirming its exit, and the termination's record
    counted it unaccounted."""
    child = tree.root.spawn("r26-refresh")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:search"], ttl=600)
    me = Agent.join(server.url, child.credential)
    gate = ToolGate(server.tool_server("r26-refresh-gate"), "r26-refresh-gate")
    tokens = me.token_source(grant)
    # The token in the last third of its life: the next call refreshes it
    # first (as every token comes to, minutes after it was minted).
    now = datetime.now(timezone.utc)
    tokens._issued = now - timedelta(minutes=5)
    tokens.grant.expires_at = now + timedelta(seconds=30)
    ran: list[str] = []

    @tool_gate(gate, "search", token=tokens)
    def search(query: str) -> str:
        ran.append(query)
        return "results"

    with me, gate:
        assert me.opened.wait(10), "the child's signal stream did not open"
        terminate(tree.operator, child.node_id, "drain")
        assert me.draining.wait(10), "the child was not told to drain"
        with pytest.raises(ToolRefused) as refused:
            search("tethers")
        assert isinstance(refused.value, ConnectError)
        assert refused.value.code in ("permission_denied", "failed_precondition", "unauthenticated"), refused.value
        assert grant.token not in str(refused.value)
        me.confirm_exit("drained")
    assert ran == [], "the tool ran for a stopped agent"


def test_an_agent_whose_exit_was_confirmed_is_told_to_stop(server, tree):
    """A launcher attests an agent's exit (ConfirmExit with an operator
    token) while the agent's process is in fact still there, cut off from
    the control plane. The control plane refuses the agent's every session
    and heartbeat from then on (failed_precondition, each kept as evidence
    contradicting the exit) and its signal for such a node is "stop now";
    but the refusal came before that signal, and the SDK took it for a
    passing fault: it reconnected and beat every few seconds for ever, and
    never set ``aborted``, so the agent's work went on."""
    child = tree.root.spawn("r26-attested")
    me = Agent.join(server.url, child.credential)
    me.heartbeat_every = 0.2
    tree.operator.call("AgentService", "ConfirmExit", {"nodeId": child.node_id, "reason": "its process is gone"})
    stopped: list = []
    me.on_abort(stopped.append)
    with me:
        assert me.aborted.wait(10), "the agent was never told to stop after its exit was confirmed"
        wait_for("the agent to stop following the control plane", lambda: all(not t.is_alive() for t in me._threads))
    assert stopped and stopped[0].abort
    assert me.run_error is not None and me.run_error.code == "failed_precondition"


def test_a_lease_job_whose_agents_exit_was_confirmed_is_told_to_stop(server, tree, tmp_path):
    """The same attested exit, seen by the agent's LeaseWorker rather than
    its signals: the control plane refuses the job's every renewal
    (failed_precondition: the node's exit was confirmed; a lease's own
    refusals are decisions, not errors) and keeps each as evidence against
    the exit. The renew thread logged the refusal and renewed again until
    the job's window lapsed on the worker's clock (a lease's duration), and
    ``stopped`` was not set: the job's work went on. The job now ends at the
    first such refusal."""
    from tether_agentsdk import Conn, LeaseWorker
    from tether_agentsdk.leaseworker import JOB_ENDED

    child = tree.root.spawn("r26-attested-job")
    job_id = "job-" + child.node_id
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=LOOP_RENEW_EVERY)
    try:
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "600s"})["lease"]
        job = w.accept(offered)
        tree.operator.call("AgentService", "ConfirmExit", {"nodeId": child.node_id, "reason": "its process is gone"})
        assert job.stopped.wait(10), "the job still runs after its agent's exit was confirmed: its renewals are refused, each kept as evidence against the exit"
        assert job.cause == JOB_ENDED, job.cause
        assert job.refusal is not None and job.refusal.code == "failed_precondition", job.refusal
        assert job.done.wait(10), "the job's renew thread goes on"
    finally:
        w.close()
