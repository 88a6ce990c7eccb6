"""tool_gate: every call in the ledger, refused while draining, cancelled on
abort, the cancel acknowledged only after the tool returned."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Callable

import pytest

from helpers import terminate, tool_calls, wait_for
from tether_agentsdk import ConnectError, Conn, ToolCallCancelled, ToolGate, ToolRefused, current_call, tool_gate


# The gate reports as the tool layer with a tool-server token of its own.
def child_grant(tree, name: str, scopes=("tool:search",)):
    child = tree.root.spawn(name)
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, list(scopes), ttl=600)
    return child, grant


def termination(operator, tid: str) -> dict:
    return operator.call("SupervisorService", "GetTermination", {"terminationId": tid})["termination"]


def test_calls_are_recorded_and_scopes_checked(server, tree, gate):
    child, grant = child_grant(tree, "worker")

    @tool_gate(gate, "search", token=grant.token)
    def search(q: str) -> str:
        call = current_call()
        assert call is not None and call.node_id == child.node_id and call.grant_id == grant.grant_id
        return "results for " + q

    assert search("tether") == "results for tether"
    assert search.__name__ == "search"
    # Outside its grant's scopes: refused, and the tool never runs.
    ran = []
    with pytest.raises(ToolRefused) as e:
        with tool_gate(gate, "shell", token=grant.token):
            ran.append(True)
    assert e.value.code == "permission_denied" and not ran
    # A made-up token is refused too, and never echoed.
    with pytest.raises(ToolRefused) as e:
        gate.run("forged.token.here", "search", lambda: ran.append(True))
    assert "forged.token.here" not in str(e.value) and not ran


def test_a_draining_subtree_refuses_new_gated_calls(server, tree, gate):
    # A call in flight keeps the drain open (drain lets it finish); a new
    # call meanwhile is refused before the tool runs, and both are on the
    # record.
    child, grant = child_grant(tree, "worker")
    inside, finish = threading.Event(), threading.Event()
    ran = []

    @tool_gate(gate, "search", token=grant.token)
    async def search(n: int) -> str:
        ran.append(n)
        if n == 1:
            inside.set()
            await asyncio.to_thread(finish.wait, 30)
        return f"result {n}"

    async def main():
        first = asyncio.ensure_future(search(1))
        await asyncio.to_thread(inside.wait, 10)
        term = await asyncio.to_thread(terminate, tree.operator, tree.root.node_id, "drain", confirm="1s")  # the child's ancestor
        await asyncio.to_thread(tree.root.draining.wait, 10)
        with pytest.raises(ToolRefused) as e:
            await search(2)
        assert e.value.draining and e.value.code == "failed_precondition"
        with pytest.raises(ToolRefused):
            with tool_gate(gate, "search", token=grant.token):
                ran.append(3)
        finish.set()
        assert await asyncio.wait_for(first, 30) == "result 1"  # a drain is not an abort
        return term

    term = asyncio.run(main())
    assert ran == [1]
    wait_for("the termination to finish", lambda: termination(tree.operator, term["terminationId"])["state"] == "TERMINATION_STATE_TERMINATED")
    assert sorted(c["resolution"] for c in tool_calls(tree.operator, term["terminationId"])) == [
        "CALL_RESOLUTION_COMPLETED", "CALL_RESOLUTION_REJECTED_DRAINING", "CALL_RESOLUTION_REJECTED_DRAINING"]


def test_abort_cancels_an_in_flight_async_call_and_the_record_shows_it(server, tree, gate):
    child, grant = child_grant(tree, "worker")
    inside = threading.Event()
    observed = threading.Event()
    acks_pending_while_returning: list[int] = []
    term: dict = {}
    named = threading.Event()  # term["id"] is set: the cancel may arrive before Terminate answers

    @tool_gate(gate, "search", token=grant.token)
    async def search() -> str:
        inside.set()
        try:
            await asyncio.Event().wait()
            return "never"
        except asyncio.CancelledError:
            observed.set()
            assert await asyncio.to_thread(named.wait, 30), "Terminate did not answer"
            # The tool has not returned yet: its cancel is not acknowledged.
            t = await asyncio.to_thread(termination, tree.operator, term["id"])
            acks_pending_while_returning.append(t["progress"].get("acksPending", 0))
            raise

    async def main():
        task = asyncio.ensure_future(search())
        await asyncio.to_thread(inside.wait, 10)
        term["id"] = (await asyncio.to_thread(terminate, tree.operator, child.node_id, "abort", ack="60s", confirm="1s"))["terminationId"]
        named.set()
        with pytest.raises(ToolCallCancelled):
            await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert observed.is_set()
    assert acks_pending_while_returning == [1]
    wait_for("the termination to finish", lambda: termination(tree.operator, term["id"])["state"] == "TERMINATION_STATE_TERMINATED")
    calls = tool_calls(tree.operator, term["id"])
    assert [(c["tool"], c["resolution"], c["gateId"]) for c in calls] == [("search", "CALL_RESOLUTION_CANCELLED_ACKED", gate.gate_id)]


def test_abort_cancels_an_in_flight_sync_call(server, tree, gate):
    child, grant = child_grant(tree, "worker")
    inside = threading.Event()
    result: dict = {}

    def tool():
        try:
            with tool_gate(gate, "search", token=grant.token) as call:
                inside.set()
                # A synchronous tool polls its call's event between steps,
                # and stops by raising (check()): a block that ends normally
                # ran to its end, and is recorded completed.
                result["observed"] = call.cancelled.wait(30)
                call.check()
        except ToolCallCancelled as e:
            result["raised"] = e

    t = threading.Thread(target=tool)
    t.start()
    assert inside.wait(10)
    term = terminate(tree.operator, child.node_id, "abort", ack="60s", confirm="1s")
    t.join(30)
    assert result.get("observed") is True and isinstance(result.get("raised"), ToolCallCancelled)
    wait_for("the termination to finish", lambda: termination(tree.operator, term["terminationId"])["state"] == "TERMINATION_STATE_TERMINATED")
    assert [c["resolution"] for c in tool_calls(tree.operator, term["terminationId"])] == ["CALL_RESOLUTION_CANCELLED_ACKED"]


def test_after_a_cancel_only_a_tool_the_cancel_stopped_is_acknowledged(server, tree, gate):
    # The same probe as the Go and TypeScript gates' tests: a rogue tool
    # would like a call whose side effect happened recorded as cancelled.
    # After the order, a tool that returns its result is recorded completed
    # (and its caller gets the result), one that raises its own error failed,
    # and only one the cancellation stopped (CancelledError, or the call's
    # ToolCallCancelled) is acknowledged. Every call is settled by its
    # report: the abort does not wait out its minute of ack timeout.
    child, grant = child_grant(tree, "worker")
    started = {name: threading.Event() for name in ("completed", "failed", "stopped", "sync-completed", "sync-stopped")}
    ids: dict[str, str] = {}

    def gated_async(name: str, after: Callable[[], str]):
        @tool_gate(gate, "search", token=grant.token)
        async def tool() -> str:
            ids[name] = current_call().call_id
            started[name].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return after()
            return "never"
        return tool

    def written() -> str:
        return "written anyway"

    def disk_full() -> str:
        raise RuntimeError("disk full")

    def stop() -> str:
        raise asyncio.CancelledError()

    def gated_sync(name: str, stops: bool) -> dict:
        out: dict = {}

        def run() -> None:
            try:
                with tool_gate(gate, "search", token=grant.token) as call:
                    ids[name] = call.call_id
                    started[name].set()
                    call.cancelled.wait(30)
                    if stops:
                        call.check()
                out["result"] = "returned"
            except BaseException as e:  # noqa: BLE001 - the test reports what came out
                out["result"] = e

        out["thread"] = threading.Thread(target=run)
        out["thread"].start()
        return out

    sync_completed = gated_sync("sync-completed", stops=False)
    sync_stopped = gated_sync("sync-stopped", stops=True)

    async def main():
        tasks = {name: asyncio.ensure_future(gated_async(name, after)()) for name, after in
                 (("completed", written), ("failed", disk_full), ("stopped", stop))}
        for ev in started.values():
            assert await asyncio.to_thread(ev.wait, 10)
        term = await asyncio.to_thread(terminate, tree.operator, child.node_id, "abort", ack="60s", confirm="60s")
        out = {}
        for name, task in tasks.items():
            try:
                out[name] = await asyncio.wait_for(task, 30)
            except BaseException as e:  # noqa: BLE001
                out[name] = e
        return term, out

    term, out = asyncio.run(main())
    for s in (sync_completed, sync_stopped):
        s["thread"].join(30)
    assert out["completed"] == "written anyway", out["completed"]
    assert isinstance(out["failed"], RuntimeError) and str(out["failed"]) == "disk full", repr(out["failed"])
    assert isinstance(out["stopped"], ToolCallCancelled), repr(out["stopped"])
    assert sync_completed["result"] == "returned", repr(sync_completed["result"])
    assert isinstance(sync_stopped["result"], ToolCallCancelled), repr(sync_stopped["result"])
    # Settled without the ack timeout: the abort reconciles at once (the
    # child never opened a session; its exit is confirmed below).
    tid = term["terminationId"]
    wait_for("the abort to reconcile", lambda: termination(tree.operator, tid)["state"] in ("TERMINATION_STATE_RECONCILING", "TERMINATION_STATE_TERMINATED"))
    tree.operator.call("AgentService", "ConfirmExit", {"nodeId": child.node_id})
    wait_for("the termination to finish", lambda: termination(tree.operator, tid)["state"] == "TERMINATION_STATE_TERMINATED")
    by_id = {c["callId"]: c for c in tool_calls(tree.operator, tid)}
    want = {"completed": "CALL_RESOLUTION_COMPLETED", "failed": "CALL_RESOLUTION_FAILED", "stopped": "CALL_RESOLUTION_CANCELLED_ACKED",
            "sync-completed": "CALL_RESOLUTION_COMPLETED", "sync-stopped": "CALL_RESOLUTION_CANCELLED_ACKED"}
    got = {name: by_id.get(ids[name], {}).get("resolution") for name in want}
    assert got == want
    for name, resolution in want.items():
        acked_by = by_id[ids[name]].get("acknowledgedBy", "")
        assert bool(acked_by) == (resolution == "CALL_RESOLUTION_CANCELLED_ACKED"), (name, acked_by)


def test_a_gate_that_never_acknowledges_is_on_the_record(server, tree):
    # The rogue tool layer: it ignores the cancel order. The record does
    # not take its silence for an acknowledgement.
    rogue_name = "pytest-rogue-" + uuid.uuid4().hex[:8]
    rogue = ToolGate(server.tool_server(rogue_name), rogue_name, never_ack=True).start()
    assert rogue.ready.wait(10)
    child, grant = child_grant(tree, "worker")
    inside, release = threading.Event(), threading.Event()
    late: list[ConnectError] = []

    def tool():
        try:
            with tool_gate(rogue, "search", token=grant.token):
                inside.set()
                release.wait(60)
        except ConnectError as e:
            late.append(e)

    t = threading.Thread(target=tool)
    t.start()
    try:
        assert inside.wait(10)
        term = terminate(tree.operator, child.node_id, "abort", ack="1s", confirm="1s")
        wait_for("the termination to finish", lambda: termination(tree.operator, term["terminationId"])["state"] == "TERMINATION_STATE_TERMINATED")
        assert [c["resolution"] for c in tool_calls(tree.operator, term["terminationId"])] == ["CALL_RESOLUTION_CANCEL_UNACKNOWLEDGED"]
    finally:
        release.set()
        t.join(30)
        rogue.close()
    # The rogue's report of the call's end, once the record is written,
    # is refused: it changes nothing on the record.
    assert [e.code for e in late] == ["failed_precondition"], late


def test_a_tool_error_with_a_lone_surrogate_still_ends_the_call(server, tree, gate):
    # A hostile agent's JSON input may hold a lone surrogate ("\udcff" is
    # valid JSON; Python decodes it, and so do undecodable file names):
    # a tool error echoing it is still reported, with U+FFFD in its place,
    # and the caller sees the tool's own error. Before, EndCall carried
    # invalid UTF-8, the control plane refused it, and the ended call stayed
    # in flight.
    child, grant = child_grant(tree, "surrogate-worker")

    @tool_gate(gate, "search", token=grant.token)
    def search(q: str) -> str:
        raise ValueError("no such file: " + q)

    with pytest.raises(ValueError) as e:
        search("bad\udcffname")
    assert "no such file" in str(e.value)
    still_open = tree.operator.call("ToolService", "ListCalls", {"nodeId": child.node_id}).get("calls", [])
    assert still_open == [], "the call's end was never recorded"


class _LeaveOnceBegun(Conn):
    """The gate's connection, cancelling the caller's task as soon as the
    control plane has answered BeginCall, before the gate reads it: the
    moment a rogue caller picks to leave."""

    leave: Callable[[], None] = staticmethod(lambda: None)

    def call(self, service, method, request=None, **kwargs):
        answer = super().call(service, method, request, **kwargs)
        if method == "BeginCall":
            self.leave()
        return answer


def test_a_caller_that_leaves_during_the_begin_leaves_no_call_in_flight(server, tree):
    # The same probe as the Go and TypeScript gates' tests. Before, the
    # task's cancellation dropped the begun call: the ledger kept it in
    # flight, nobody would end it, a drain waited for it.
    child, grant = child_grant(tree, "leaver")
    name = "pytest-gate-leaver-" + uuid.uuid4().hex[:6]
    minted = server.tool_server(name)
    conn = _LeaveOnceBegun(minted.base_url, minted.token)
    gate = ToolGate(conn, name).start()
    assert gate.ready.wait(10)
    ran = []

    @tool_gate(gate, "search", token=grant.token)
    async def search() -> str:
        ran.append(True)
        return "ran"

    async def main():
        task = asyncio.ensure_future(search())
        loop = asyncio.get_running_loop()
        conn.leave = lambda: loop.call_soon_threadsafe(task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        assert not ran, "the tool ran for a caller that had left"
        wait_for("the abandoned call's end", lambda: tree.operator.call("ToolService", "ListCalls", {"nodeId": child.node_id}).get("calls", []) == [])
    finally:
        gate.close()


def test_a_caller_that_leaves_after_the_cancel_was_ordered_has_its_call_acknowledged(server, tree):
    # The rule of every SDK gate (the Go and TypeScript gates' tests probe
    # it with a caller that cancels the running tool): a call its caller's
    # cancellation stopped before the gate heard the order is acknowledged
    # if the control plane has ordered the cancel, and failed otherwise.
    # Here the caller leaves during the begin, once the abort has ordered
    # the call cancelled: the tool never ran, and the abort, which waits for
    # this call's acknowledgement, gets it. Before, the gate ended it failed.
    child, grant = child_grant(tree, "late-leaver")
    name = "pytest-gate-late-leaver-" + uuid.uuid4().hex[:6]
    minted = server.tool_server(name)
    conn = _LeaveOnceBegun(minted.base_url, minted.token)
    gate = ToolGate(conn, name).start()
    assert gate.ready.wait(10)
    ran = []
    terms: list[dict] = []

    def open_calls() -> list[dict]:
        return tree.operator.call("ToolService", "ListCalls", {"nodeId": child.node_id}).get("calls", [])

    @tool_gate(gate, "search", token=grant.token)
    async def search() -> str:
        ran.append(True)
        return "ran"

    async def main():
        task = asyncio.ensure_future(search())
        loop = asyncio.get_running_loop()

        def leave() -> None:
            # On the begin's thread, before the gate reads the answer.
            terms.append(terminate(tree.operator, child.node_id, "abort", ack="60s", confirm="60s"))
            wait_for("the cancel order", lambda: [c.get("state") for c in open_calls()] == ["CALL_STATE_CANCEL_REQUESTED"])
            loop.call_soon_threadsafe(task.cancel)

        conn.leave = leave
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        assert not ran, "the tool ran for a caller that had left"
        tid = terms[0]["terminationId"]
        wait_for("the abort to reconcile", lambda: termination(tree.operator, tid)["state"] in ("TERMINATION_STATE_RECONCILING", "TERMINATION_STATE_TERMINATED"))
        tree.operator.call("AgentService", "ConfirmExit", {"nodeId": child.node_id})
        wait_for("the termination to finish", lambda: termination(tree.operator, tid)["state"] == "TERMINATION_STATE_TERMINATED")
        calls = tool_calls(tree.operator, tid)
        assert [(c["resolution"], c.get("acknowledgedBy", "")) for c in calls] == [("CALL_RESOLUTION_CANCELLED_ACKED", "tool:" + name)], calls
    finally:
        gate.close()
