"""The seventeenth hostile pass on the Python SDK, through the real server:
a job's lease on which the coordinator recorded an ownership conflict (a
second claimant of the active generation, from the lineage that
coordinates the job) halts execution — renewals no longer extend
authority, progress is not applied, completion is refused — and the Go and
TypeScript workers end the job on the answer that says so. The Python
worker went on: its job was neither stopped nor lost while the lease stayed
ACTIVE, so its work ran on, renewing in vain, up to the lease's expiry."""

from __future__ import annotations

import http.client
import json
import struct
import threading
import urllib.parse

import pytest

from helpers import LoopbackPeer, QuietHandler, terminate, wait_for
from conftest import require_extra
from tether_agentsdk import Agent, Conn, GrantRevoked, LeaseWorker, ToolCallCancelled, ToolGate, Verifier, _wire
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


class ShapeBreakingPeer(LoopbackPeer):
    """A control-plane-side peer on loopback in front of the real server (a
    proxy gone wrong, or a hostile one): it relays every call, except that
    it answers the first call of each method in ``once`` itself, with a JSON
    object of the wrong shape (a unary answer, or a stream's one message
    before the stream breaks)."""

    def __init__(self, upstream: str, once: dict[str, dict]):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.once = dict(once)
        self.served: dict[str, int] = {}
        self.lock = threading.Lock()
        peer = self

        class Handler(QuietHandler):
            def do_GET(self):  # the key set
                self.do_POST()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command == "POST" else None
                method = self.path.rsplit("/", 1)[-1]
                with peer.lock:
                    bad = peer.once.pop(method, None)
                    if bad is not None:
                        peer.served[method] = peer.served.get(method, 0) + 1
                if bad is not None:
                    data = json.dumps(bad).encode()
                    streaming = self.headers.get("Content-Type", "").startswith("application/connect+")
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json" if streaming else "application/json")
                    self.end_headers()
                    self.wfile.write(struct.pack(">BI", 0, len(data)) + data if streaming else data)
                    return  # a stream breaks after its message (HTTP/1.0: the connection closes)
                up = http.client.HTTPConnection(peer.upstream.hostname, peer.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                up.request(self.command, self.path, body=body, headers=headers)
                self.relay_answer(up)

        self.serve(Handler)

    def has_served(self, *methods: str) -> bool:
        with self.lock:
            return all(self.served.get(m) for m in methods)


# The signal stream, the heartbeat and the lease renew loop each run on a
# daemon thread that caught only ConnectError: one answer of the wrong shape
# (an "opened" that is not an object, a credential that is a string, a lease
# that is a list) raised out of the loop and ended the thread, silently. The
# agent then never heard its stop, nor the job its cancel: it ran on. Go and
# TypeScript drop such a stream as broken and open it again.


def test_an_answer_of_the_wrong_shape_does_not_deafen_the_agent_to_its_stop(server, operator):
    root = Agent.register_root(operator, "rogue17-deafened")
    peer = ShapeBreakingPeer(server.url, {
        "WatchSignals": {"opened": ["not", "an", "object"]},
        "Heartbeat": {"credential": "not an object", "signal": "abort"},
    })
    agent = Agent.join(peer.url, root.credential)
    agent.heartbeat_every = 0.1
    try:
        agent.start()
        wait_for("the peer's two bad answers", lambda: peer.has_served("WatchSignals", "Heartbeat"))
        terminate(operator, root.node_id, "abort", window="5s", ack="5s", confirm="5s")
        assert agent.aborted.wait(30), "the agent never heard its abort: a bad answer ended its signal and heartbeat threads"
        assert agent.signal is not None and agent.signal.abort
    finally:
        agent.close()
        root.close()
        peer.close()


def test_an_answer_of_the_wrong_shape_does_not_deafen_a_job_to_its_cancel(server, tree, tmp_path):
    child = tree.root.spawn("worker")
    job_id = "job-deafened-" + child.node_id
    peer = ShapeBreakingPeer(server.url, {"Renew": {"lease": ["not", "an", "object"], "decision": {}}})
    w = LeaseWorker(Conn(peer.url, child.credential), str(tmp_path), renew_every=0.1)
    job = w.accept(tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "300s"})["lease"])
    try:
        wait_for("the peer's bad answer", lambda: peer.has_served("Renew"))
        tree.operator.call("LeaseService", "RequestCancel", {"jobId": job_id, "reason": "stop the job"})
        assert job.cancelled.wait(30), "the job never heard its cancel: a bad answer ended its renew loop"
    finally:
        job.stop()
        w.close()
        peer.close()


def test_an_answer_of_the_wrong_shape_does_not_deafen_a_gate_to_its_cancel_orders(server, tree):
    # A gate deaf to its orders lets a stopped agent's call run on: the
    # rogue's call escapes its abort, and the record blames the tool server.
    name = "rogue17-gate-" + tree.root.node_id[-8:]
    minted = tree.operator.call("AuthService", "CreateToken", {"toolServer": name})
    peer = ShapeBreakingPeer(server.url, {"WatchCancels": {"callId": ["not", "a", "call", "id"]}})
    gate = ToolGate(Conn(peer.url, minted["token"]), name).start()
    child = tree.root.spawn("rogue")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:search"], ttl=600)
    try:
        wait_for("the peer's bad order", lambda: peer.has_served("WatchCancels"))
        with pytest.raises(ToolCallCancelled):
            with gate.call(grant.token, "search") as call:
                terminate(tree.operator, child.node_id, "abort", window="5s", ack="30s", confirm="5s")
                assert call.cancelled.wait(30), "the gate never heard the order: a bad answer ended its thread"
                call.check()
    finally:
        gate.close()
        peer.close()


def test_an_answer_of_the_wrong_shape_does_not_stall_a_verifier_for_good(server, tree):
    # A verifier whose feed thread ended is stale from then on: it fails
    # closed (refusing every honest agent's token) and never hears a
    # revocation again.
    require_extra("cryptography")
    peer = ShapeBreakingPeer(server.url, {"WatchRevocations": {"tombstones": ["not a tombstone"], "headSequence": "1"}})
    v = Verifier(Conn(peer.url, server.admin), staleness_budget=30.0)
    child = tree.root.spawn("worker")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:search"], ttl=600)
    try:
        with v:
            wait_for("the peer's bad feed message", lambda: peer.has_served("WatchRevocations"))
            assert v.ready.wait(30), "the feed never delivered: a bad message ended the verifier's thread"
            v.verify(grant.token)
            seq = _wire.uint64(tree.operator.call("CapabilityService", "Revoke", {"grantId": grant.grant_id, "reason": "rogue17"})["sequence"])
            assert v.wait_for_sequence(seq, timeout=30), "the revocation never arrived"
            with pytest.raises(GrantRevoked):
                v.verify(grant.token)
    finally:
        peer.close()
