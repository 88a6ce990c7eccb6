"""The twentieth hostile pass on the Python SDK: the promises the Go SDK's
rogue tests pin, kept here too, against loopback peers standing where the
control plane would be. A gate held every cancel order for a call it had
not registered while a begin was under way (the Go gate holds at most
MaxEarlyOrders); and a verifier's key-set fetch bounded each read, not the
fetch: a peer trickling its key set held ``start()``, and any check of a
token with an unknown kid, for as long as it liked. And a job whose ACK
was answered with another generation's lease claimed the generation the
answer named, not the one it acknowledged (the Go job claims the offered
one, and ends as superseded)."""

from __future__ import annotations

import json
import struct
import threading

from conftest import require_extra
from helpers import HeldBeginPeer, LoopbackPeer, QuietHandler
from tether_agentsdk import Conn, LeaseWorker, ToolCallCancelled, ToolGate
from tether_agentsdk.leaseworker import LEASE_LOST
from tether_agentsdk.toolgate import MAX_EARLY_ORDERS


def _envelope(flags: int, msg: dict) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


def test_a_gate_holds_at_most_max_early_orders_while_a_begin_is_under_way():
    flood = 5 * MAX_EARLY_ORDERS
    peer = HeldBeginPeer("call-a")
    gate = ToolGate(Conn(peer.url, "rogue20-tool-token"), "py-rogue20-gate").start()
    outcomes: dict[str, object] = {}
    running = threading.Event()

    def call_a():
        # Runs until its cancel order, which the peer sends after the
        # flood: once it stops, the gate has read every order of it.
        try:
            with gate.call("a-capability-token", "shell") as call:
                running.set()
                assert call.cancelled.wait(30)
                call.check()
        except BaseException as e:  # noqa: BLE001 — the test reads it
            outcomes["a"] = e

    def call_b():
        try:
            with gate.call("a-capability-token", "shell"):
                outcomes["b"] = "done"
        except BaseException as e:  # noqa: BLE001 — the test reads it
            outcomes["b"] = e

    a = threading.Thread(target=call_a, daemon=True)
    b = threading.Thread(target=call_b, daemon=True)
    try:
        assert peer.watching.wait(30)
        a.start()
        assert running.wait(30)
        b.start()
        assert peer.second_begun.wait(30)
        orders = [{"callId": f"made-up-{i}", "reason": "flood"} for i in range(flood)]
        peer.orders.put(b"".join(_envelope(0, o) for o in orders + [{"callId": "call-a", "reason": "termination t1 cancelled the call"}]))
        a.join(30)
        assert isinstance(outcomes.get("a"), ToolCallCancelled), outcomes
        assert gate.held_orders <= MAX_EARLY_ORDERS, f"the gate holds {gate.held_orders} orders for calls it has not registered"

        peer.begin_answer.put({"call": {"callId": "call-b", "tool": "shell"}})
        b.join(30)
        assert outcomes.get("b") == "done", outcomes
        assert gate.held_orders == 0
    finally:
        gate.close()
        peer.close()


class TricklingKeysPeer(LoopbackPeer):
    """Answers the key set one byte at a time, each soon enough to beat any
    socket timeout, for as long as the test runs; refuses the rest."""

    def __init__(self):
        super().__init__()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(1 << 20))
                self.end_headers()
                try:
                    while not peer.closing.wait(0.05):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:
                    pass  # the caller gave up

            def do_POST(self):
                self.read_body()
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.serve(Handler)


def test_a_key_set_that_trickles_is_given_up_at_the_connection_s_timeout():
    require_extra("cryptography")
    from tether_agentsdk import Verifier

    peer = TricklingKeysPeer()
    verifiers: list = []

    def start():
        verifiers.append(Verifier(Conn(peer.url, "rogue20-token", timeout=0.5), offline=True).start())

    t = threading.Thread(target=start, daemon=True)
    try:
        t.start()
        # A bound, not a timing: the fetch ends at the connection's timeout,
        # or only when the peer stops (at the test's end).
        t.join(20)
        assert not t.is_alive(), "the verifier still reads a key set that never ends"
    finally:
        peer.close()
        t.join(30)
        for v in verifiers:
            v.close()


class OtherGenerationAckPeer(LoopbackPeer):
    """Answers an ACK with a later generation's lease, accepted; counts the
    renewals, and answers none of them."""

    def __init__(self):
        super().__init__()
        self.renewals = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                if method == "Ack":
                    self.answer_json({
                        "lease": {"jobId": "py-rogue20-ack", "leaseId": "l2", "leaseGeneration": "2",
                                  "state": "LEASE_STATE_ACTIVE", "leaseDuration": "300s"},
                        "decision": {"outcome": "OUTCOME_ACCEPTED", "auditEvent": "AUDIT_EVENT_ACKED"},
                    })
                    return
                peer.renewals += 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.serve(Handler)


def test_a_job_claims_the_generation_it_acknowledged_whatever_the_answer_names(tmp_path):
    peer = OtherGenerationAckPeer()
    w = LeaseWorker(Conn(peer.url, "rogue20-agent-token"), str(tmp_path), renew_every=3600)
    try:
        job = w.accept({"jobId": "py-rogue20-ack", "leaseId": "l1", "leaseGeneration": "1", "state": "LEASE_STATE_OFFERED"})
        try:
            assert job.headers() == {"Tether-Job-Id": "py-rogue20-ack", "Tether-Lease-Generation": "1"}
            assert job.stopped.is_set(), "a job whose ACK's answer names a later generation goes on"
            assert job.cause == LEASE_LOST, job.cause
            assert peer.renewals == 0
        finally:
            job.stop()
    finally:
        w.close()
        peer.close()
