"""The fortieth hostile pass on the Python tool gate (letter K).

A tool that fails with what its input (or an upstream's answer to it) says
went wrong, as it came, raises what a rogue caller chose: an exception whose
``__str__`` raises, or returns no text. The gate raised on describing it,
before it reported the end: the call stayed in flight for good (a drain
waited for it to its deadline, the abort's cancel went unacknowledged, the
tool server blamed). The TypeScript gate records such a call failed since
this pass, the Go gate a handler's panic since the thirty-ninth (and its
error with no text since this pass); so does the Python gate now, with a
placeholder for the text, the tool's own exception going on to its caller.
"""

from __future__ import annotations

import asyncio

import pytest



class RaisingText(Exception):
    """An error whose text raises (a rogue input's, rethrown as it came)."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class NotText(Exception):
    """An error whose text is no text: str() raises TypeError."""

    def __str__(self):  # type: ignore[override]
        return 1


def open_calls(operator, node_id: str) -> list[dict]:
    return operator.call("ToolService", "ListCalls", {"nodeId": node_id}).get("calls", [])


@pytest.mark.parametrize("rogue", [RaisingText, NotText])
def test_rogue40K_a_tool_error_with_no_text_is_recorded_failed(server, tree, gate, rogue):
    child = tree.root.spawn("r40k-" + rogue.__name__.lower())
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:echo"], ttl=600)

    def tool() -> None:
        raise rogue()

    async def atool() -> None:
        raise rogue()

    failures = []
    with pytest.raises(Exception) as sync_raised:
        gate.run(grant.token, "echo", tool)
    failures.append(sync_raised.value)
    with pytest.raises(Exception) as async_raised:
        asyncio.run(gate.arun(grant.token, "echo", atool))
    failures.append(async_raised.value)

    left = open_calls(tree.operator, child.node_id)
    assert not left, f"{len(left)} of 2 calls still in flight after their tools failed: nobody will end them"
    assert [type(f) for f in failures] == [rogue, rogue], "the caller gets the tool's own exception"
    assert not gate._inflight, "the gate still holds the calls"
