"""The forty-fifth hostile pass on the MCP tether (letter F), the Go and
TypeScript gates' fix (TestRogue45FGateRefusesABeginCallAnswerNamingAnotherCallInFlight,
rogue45F.test.ts) brought to Python: the gate's path to the control plane (a
proxy that replays, caches or crosses answers) answers one call's BeginCall
with the answer to another call the gate has in flight.

The gate took any call id it was answered: the second call ran its block
under the first's id, its registration replaced the first call in the
gate's calls in flight and its end removed it, and its EndCall recorded the
first call completed while the first's block still ran, deaf to its cancel
(the control plane had none to order: the call was ended). Now the second
call is refused (internal), its block not run, and the first stays in
flight and hears its cancel.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from helpers import terminate, wait_for
from tether_agentsdk import Conn, ConnectError, ToolCallCancelled, ToolGate


class _CrossingPath(Conn):
    """The gate's path: it answers the second BeginCall it relays with the
    answer to the first, whatever the control plane answered the second."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.begins = 0
        self.first: dict | None = None
        self._mu = threading.Lock()

    def call(self, service, method, request=None, **kwargs):
        if method != "BeginCall":
            return super().call(service, method, request, **kwargs)
        with self._mu:
            self.begins += 1
            n = self.begins
        try:
            answer = super().call(service, method, request, **kwargs)
        except ConnectError:
            if n == 2 and self.first is not None:  # whatever the control plane answered
                return self.first
            raise
        if n == 1:
            self.first = answer
        elif n == 2:
            return self.first
        return answer


@pytest.mark.parametrize("path", ["with", "async with"])
def test_rogue45f_a_crossed_begin_call_answer_does_not_run_the_block_under_another_calls_id(server, tree, path):
    child = tree.root.spawn("rogue45f-" + path.replace(" ", "-"))
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:write"], ttl=600)
    name = "pytest-gate-rogue45f-" + uuid.uuid4().hex[:6]
    minted = server.tool_server(name)
    conn = _CrossingPath(minted.base_url, minted.token, retry=minted.retry)
    gate = ToolGate(conn, name).start()
    assert gate.ready.wait(10), "the gate's cancel orders stream did not open"
    # Call B: its block runs until its cancel (or the test's end).
    started, release = threading.Event(), threading.Event()
    outcome_b: list[object] = []

    def call_b() -> None:
        try:
            with gate.call(grant.token, "write") as call:
                started.set()
                while not call.cancelled.wait(0.05) and not release.is_set():
                    pass
                call.check()
            outcome_b.append("returned")
        except BaseException as e:  # noqa: BLE001 - the test reads what B ended with
            outcome_b.append(e)

    b = threading.Thread(target=call_b, daemon=True)
    b.start()
    try:
        assert started.wait(20), f"call B's block never ran: {outcome_b}"

        # Call A: the path answers its BeginCall with B's answer.
        ran: list[str] = []

        async def call_a_async() -> None:
            async with gate.call(grant.token, "write"):
                ran.append("written")  # the side effect

        try:
            if path == "with":
                with gate.call(grant.token, "write"):
                    ran.append("written")  # the side effect
            else:
                asyncio.run(call_a_async())
            outcome_a: object = "returned"
        except ConnectError as e:
            outcome_a = e
        assert ran == [], f"call A answered with call B's begin: its block ran {len(ran)} time(s), the call {outcome_a}"
        assert isinstance(outcome_a, ConnectError) and outcome_a.code == "internal", f"call A: {outcome_a}"

        # The ledger: B still in flight while its block runs, and A's own call.
        b_id = conn.first["call"]["callId"]
        open_calls = [c["callId"] for c in tree.operator.call("ToolService", "ListCalls", {"nodeId": child.node_id}).get("calls", [])]
        assert b_id in open_calls and len(open_calls) == 2, f"call B ({b_id}) not in flight: open calls {open_calls}"

        # The abort: B's block hears its cancel and the gate acknowledges it.
        terminate(tree.operator, child.node_id, "abort", ack="30s", confirm="2s")
        # A guard against a hang, not a timing.
        wait_for("call B to end", lambda: bool(outcome_b))
        assert isinstance(outcome_b[0], ToolCallCancelled), f"call B: {outcome_b[0]!r}"
    finally:
        release.set()
        b.join(20)
        gate.close()


def test_rogue45f_a_begin_call_answer_of_another_tool_does_not_run_the_block(server, tree):
    # The path answers a call of the tool "read" with the answer to an
    # earlier call of "write" (ended: no call the gate has in flight). The
    # gate ran "read" under the "write" call's id: a call's answer names its
    # tool, and one naming another is not this call's.
    child = tree.root.spawn("rogue45f-tool")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:write"], ttl=600)
    name = "pytest-gate-rogue45f-tool-" + uuid.uuid4().hex[:6]
    minted = server.tool_server(name)
    conn = _CrossingPath(minted.base_url, minted.token, retry=minted.retry)
    gate = ToolGate(conn, name).start()
    try:
        assert gate.ready.wait(10), "the gate's cancel orders stream did not open"
        with gate.call(grant.token, "write"):
            pass
        ran: list[str] = []
        try:
            with gate.call(grant.token, "read"):
                ran.append("read")  # the side effect
            outcome: object = "returned"
        except ConnectError as e:
            outcome = e
        assert ran == [], f"a call of read answered with a call of write: its block ran {len(ran)} time(s), the call {outcome}"
        assert isinstance(outcome, ConnectError) and outcome.code == "internal", f"the call: {outcome}"
    finally:
        gate.close()
