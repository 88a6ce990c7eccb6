"""The thirty-ninth hostile pass on the Python SDK's ToolGate, against a
loopback peer standing where the control plane would be (a hostile one, or
a proxy gone wrong): the gate held each early cancel order's reason as it
came, and the Go and TypeScript gates hold none. With a begin under way, a
flood of orders for made-up call ids (each id short enough to be held)
with reasons of up to a message's 16 MiB had up to MAX_EARLY_ORDERS of
them held — gigabytes — and a reason of that size became the message of
the ToolCallCancelled the gated tool raised (and its caller logs). The
control plane's reasons are at most 1024 bytes (a termination's
MaxReasonBytes): a gate now keeps at most that much of one."""

from __future__ import annotations

import threading

from helpers import HeldBeginPeer, connect_envelope as _envelope
from tether_agentsdk import Conn, ToolCallCancelled, ToolGate

# The control plane's bound on a termination's reason (supervisor.MaxReasonBytes).
_REASON_BYTES = 1024


def test_rogue39K_a_gate_keeps_no_more_of_a_cancel_orders_reason_than_a_control_plane_sends():
    peer = HeldBeginPeer("c-py-rogue39k-a")
    gate = ToolGate(Conn(peer.url, "rogue39k-tool-token"), "py-rogue39k-gate").start()
    outcomes: dict[str, object] = {}
    running = threading.Event()

    def call(name: str):
        try:
            with gate.call("a-capability-token", "shell") as c:
                if name == "a":
                    running.set()
                    assert c.cancelled.wait(30)
                c.check()
                outcomes[name] = "done"
        except BaseException as e:  # noqa: BLE001 — the test reads it
            outcomes[name] = e

    a = threading.Thread(target=call, args=("a",), daemon=True)
    b = threading.Thread(target=call, args=("b",), daemon=True)
    try:
        assert peer.watching.wait(30)
        a.start()
        assert running.wait(30)
        b.start()
        assert peer.second_begun.wait(30)
        # 64 orders for made-up ids, 256 KiB of reason each (16 MiB in
        # all), then b's early order and a's, 1 MiB of reason each.
        flood = b"".join(_envelope({"callId": f"made-up-{i}", "reason": "x" * (256 << 10)}) for i in range(64))
        peer.orders.put(flood
                        + _envelope({"callId": "c-py-rogue39k-b", "reason": "a" + "é" * (512 << 10)})
                        + _envelope({"callId": "c-py-rogue39k-a", "reason": "z" * (1 << 20)}))
        a.join(30)
        err_a = outcomes.get("a")
        assert isinstance(err_a, ToolCallCancelled), outcomes
        kept = len(err_a.reason.encode())
        assert kept <= _REASON_BYTES, f"call a's cancellation carries {kept} bytes of reason"
        # Every order was read before a's: the held ones are there.
        assert gate.held_orders == 65, gate.held_orders
        held = sum(len(reason.encode()) for reason, _ in gate._orders.values())
        assert held <= 65 * _REASON_BYTES, f"the gate holds {held} bytes of reasons for 65 early orders"
        peer.begin_answer.put({"call": {"callId": "c-py-rogue39k-b", "tool": "shell"}})
        b.join(30)
        err_b = outcomes.get("b")
        assert isinstance(err_b, ToolCallCancelled), outcomes
        # Cut at a character boundary: what is kept is whole characters.
        assert err_b.reason[:1] == "a" and set(err_b.reason[1:]) == {"é"}, err_b.reason[:40]
        kept = len(err_b.reason.encode())
        assert kept <= _REASON_BYTES, f"call b's cancellation carries {kept} bytes of reason"
        assert gate.held_orders == 0, gate.held_orders
    finally:
        gate.close()
        peer.close()
