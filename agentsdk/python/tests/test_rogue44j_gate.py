"""The forty-fourth hostile pass, SDK parity (letter J): a Python
``ToolGate`` whose ``WatchCancels`` stream's headers a path withholds is
ready all the same, as the Go gate's ``Ready`` (closed once the stream is
asked for) and, since this pass, the TypeScript gate's ``ready``.

A hostile element on a tool server's path holds the gate's stream open and
sends nothing back, not even its headers. The Python gate set ``ready``
once a stream opened, so a tool server that waits on ``ready`` before it
serves was held for as long as the path withheld them (each attempt the
connection's timeout, 30 s by default, then another); and a gate busy
meanwhile was refreshed only once a stream had opened, so its cancel order
waited the connection's timeout, not the refresh interval. ``ready`` is now
set once the stream is asked for, and a busy gate gives up a stream that
carries nothing at the refresh interval whether it opened or not.
"""

from __future__ import annotations

import http.client
import threading

from conftest import NO_RETRY
from helpers import CancelledToolCall, QuietHandler, WatchCancelsPath, relay_end
from tether_agentsdk import Conn, ToolGate


class WithholdingPath(WatchCancelsPath):
    """A relay on loopback in front of the real server that holds every
    WatchCancels stream open and sends nothing of it back, not even its
    headers, while ``withholding`` is set, until the gate leaves it; it
    relays every other request, and every stream once cleared, as it came.
    It counts the streams the gate asked for."""

    def __init__(self, upstream: str):
        self.withholding = threading.Event()
        self.withholding.set()
        super().__init__(upstream)

    def watch(self, handler: QuietHandler, up: http.client.HTTPConnection, n: int) -> None:
        if not self.withholding.is_set():
            super().watch(handler, up, n)
            return
        threading.Thread(target=relay_end, args=(handler.connection, up.sock), daemon=True).start()
        # Nothing back until the gate leaves the stream.
        relay_end(handler.connection, up.sock)
        up.close()


def test_rogue44j_a_path_withholding_the_cancel_streams_headers_does_not_hold_the_gate(server, tree):
    name = "rogue44j-gate"
    token = server.tool_server(name).token
    path = WithholdingPath(server.url)
    # The connection's default timeout: each open the path holds lasts it.
    gate = ToolGate(Conn(path.url, token, retry=NO_RETRY), name)
    gate.cancel_watch_refresh = 0.1
    call = CancelledToolCall(tree, gate, "rogue44j-caller")
    try:
        gate.start()
        # A guard against the hang, under the connection's 30 s timeout.
        assert gate.ready.wait(20), \
            f"the gate is not ready 20 s after it started: {path.streams()} WatchCancels stream(s) asked for, their headers withheld"
        call.start()
        path.withholding.clear()  # the path honest from now on
        call.cancelled(tree.operator, lambda: f"the gate is deaf: its tool ran on 20 s (200 refresh intervals) after its abort was ordered; "
                                              f"{path.streams()} WatchCancels stream(s) asked for, the withheld one still waited on")
        assert path.streams() >= 2, f"the order heard on {path.streams()} stream(s): the withheld one relayed it"
    finally:
        gate.close()
        path.close()
