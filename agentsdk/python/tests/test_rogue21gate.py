"""The twenty-first hostile pass on the Python SDK's ToolGate, as the Go and
TypeScript SDKs' (rogue21 tests there too), against loopback peers standing
where the control plane would be: a gate's begin (and its report) waited
the connection's 30 s where the Go and TypeScript gates wait 10 s; and a
hostile control plane flooding a gate's cancel orders, while a begin is
under way, with call ids of 64 KiB had up to MAX_EARLY_ORDERS of them held,
whatever their size."""

from __future__ import annotations

import threading

from helpers import HeldBeginPeer, LoopbackPeer, QuietHandler, connect_envelope as _envelope
from tether_agentsdk import Conn, ToolCallCancelled, ToolGate

class GateTimeoutPeer(LoopbackPeer):
    """Answers a gate at once and records the deadline each of its calls
    carried (Connect-Timeout-Ms); the cancel-order stream stays empty."""

    def __init__(self):
        super().__init__()
        self.timeouts: dict[str, str] = {}
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                peer.timeouts[method] = self.headers.get("Connect-Timeout-Ms", "")
                if method == "WatchCancels":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json")
                    self.end_headers()
                    self.wfile.flush()
                    peer.closing.wait()
                    return
                if method == "BeginCall":
                    self.answer_json({"call": {"callId": "c-py-rogue21", "tool": "shell"}})
                else:
                    self.answer_json({})

        self.serve(Handler)


def test_a_gates_begin_and_report_wait_10s_as_the_go_and_typescript_gates():
    peer = GateTimeoutPeer()
    gate = ToolGate(Conn(peer.url, "rogue21-tool-token"), "py-rogue21-gate").start()
    try:
        with gate.call("a-capability-token", "shell"):
            pass
        assert peer.timeouts.get("BeginCall") == "10000", peer.timeouts
        assert peer.timeouts.get("EndCall") == "10000", peer.timeouts
        # A connection's shorter timeout is kept.
        short = ToolGate(Conn(peer.url, "rogue21-tool-token", timeout=2.5), "py-rogue21-gate-short")
        with short.call("a-capability-token", "shell"):
            pass
        assert peer.timeouts.get("BeginCall") == "2500", peer.timeouts
    finally:
        gate.close()
        peer.close()


def test_a_gate_holds_no_order_for_a_call_id_no_control_plane_issues():
    peer = HeldBeginPeer("c-py-rogue21-a")
    gate = ToolGate(Conn(peer.url, "rogue21-tool-token"), "py-rogue21-gate-flood").start()
    outcomes: dict[str, object] = {}
    running = threading.Event()

    def call_a():
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
        flood = b"".join(_envelope({"callId": f"c-{i}-" + "x" * (64 << 10), "reason": "flood"}) for i in range(64))
        peer.orders.put(flood + _envelope({"callId": "c-py-rogue21-a", "reason": "termination t1 cancelled the call"}))
        a.join(30)
        assert isinstance(outcomes.get("a"), ToolCallCancelled), outcomes
        assert gate.held_orders == 0, f"the gate holds {gate.held_orders} orders for call ids of 64 KiB"
        peer.begin_answer.put({"call": {"callId": "c-py-rogue21-b", "tool": "shell"}})
        b.join(30)
        assert outcomes.get("b") == "done", outcomes
    finally:
        gate.close()
        peer.close()
