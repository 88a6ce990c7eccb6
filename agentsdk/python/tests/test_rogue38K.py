"""The thirty-eighth hostile pass on the Python SDK's ToolGate, against a
real tether server: a synchronous gate (``ToolGate.run``, or ``tool_gate``
on a function it does not see is async: a lambda, a callable object, a
framework's wrapper) around a tool function that returns an awaitable
reported the call completed the moment the coroutine was made, before the
tool had done anything. The caller then awaited it: the tool's side effect
came after the ledger said the call had ended, outside the call, where no
drain waits for it and no cancel order reaches it. The gate now refuses
such a result: the coroutine is closed unrun, the call recorded failed,
and a TypeError says to await the tool inside the call (``arun``, or an
``async def`` under ``tool_gate``). The Go gate's handler returns only
when it is done, and the TypeScript gate awaits what its function
returns."""

from __future__ import annotations

import warnings

import pytest

from tether_agentsdk import tool_gate


def test_rogue38K_a_sync_gate_never_reports_an_awaitable_tool_ended_before_it_ran(server, tree, gate):
    child = tree.root.spawn("rogue38K-worker")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:search"], ttl=600)
    side_effects: list[str] = []

    async def search(q: str) -> str:
        side_effects.append(q)  # the side effect the ledger must not have seen end before it happened
        return "results for " + q

    # The stored entries, read from the control plane's answers to the
    # gate's reports (each call passes through to the real server).
    ended: list[dict] = []
    real_call = gate.conn.call

    def reporting(service, method, req, **kw):
        resp = real_call(service, method, req, **kw)
        if method in ("EndCall", "CancelAck"):
            ended.append(resp.get("call", {}))
        return resp

    gate.conn.call = reporting
    leaked = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for how, run in (
            ("run", lambda: gate.run(grant.token, "search", search, "via run")),
            ("tool_gate", lambda: tool_gate(gate, "search", token=grant.token)(lambda q: search(q))("via tool_gate")),
        ):
            try:
                out = run()
            except TypeError as e:
                assert "await" in str(e), (how, str(e))
                continue
            leaked.append(how)
            # What a caller does with it: the tool runs now, after its end
            # was reported.
            if hasattr(out, "send"):
                try:
                    out.send(None)
                except StopIteration:
                    pass
    assert leaked == [], f"the gate ({leaked}) reported a call ended and handed back the tool still to run; ran after its end: {side_effects}"
    assert side_effects == [], f"the tool ran outside its call: {side_effects}"
    # The ledger, as the control plane answered the gate's reports: both
    # calls failed, none completed.
    assert sorted(c.get("resolution") for c in ended) == ["CALL_RESOLUTION_FAILED", "CALL_RESOLUTION_FAILED"], ended
