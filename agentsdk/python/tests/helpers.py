"""Helpers shared by the tests (all against the real server)."""

from __future__ import annotations

import time
from typing import Callable

from tether_agentsdk import Conn


def terminate(operator: Conn, node_id: str, mode: str = "drain", *, window: str = "60s", ack: str = "30s", confirm: str = "60s") -> dict:
    return operator.call("SupervisorService", "Terminate", {
        "nodeId": node_id, "mode": "TERMINATION_MODE_" + mode.upper(), "reason": "test",
        "drainWindow": window, "cancelAckTimeout": ack, "confirmTimeout": confirm,
    })["termination"]


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Polls a condition that the server (another process) makes true; a
    bound, never a stand-in for synchronisation."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def tool_calls(operator: Conn, termination_id: str) -> list[dict]:
    """The tool calls a termination's record lists."""
    rec = operator.call("SupervisorService", "GetRecord", {"terminationId": termination_id})["record"]
    return rec.get("toolCalls", [])
