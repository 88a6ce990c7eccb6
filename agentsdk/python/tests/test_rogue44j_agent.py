"""The forty-fourth hostile pass, SDK parity (letter J): the Python
``Agent`` takes a refreshed credential of a credential's shape only, as the
Go and TypeScript agents do since the forty-first and forty-second passes.

A heartbeat's answer may carry a refreshed credential. Since the
forty-first pass (rogue41G) the Python agent kept its own unless the
answer's was a bearer token a header can carry: any printable ASCII
without a space, of any length. The Go agent takes one of a compact JWS's
shape within ``capability.MaxTokenBytes`` (8 KiB) only, and the TypeScript
agent the same (``compactJWS``). One answer forged on the path (a proxy's,
a hostile peer's) with text the Python check passed and the control plane
never takes had the Python agent present it from then on: a character
outside a JWS's alphabet, or past the 8 KiB the control plane parses, and
the control plane refused its next call unauthenticated, the agent aborting
itself, a stop nobody ordered; past the control plane's 64 KiB of headers,
and every later heartbeat and reconnect failed at the headers, for good,
the agent never hearing its stop. It now takes the same shape as the Go
and TypeScript agents (``compact_jws``), its own credential kept.
"""

from __future__ import annotations

import pytest

from conftest import NO_RETRY
from helpers import terminate, wait_for
from test_rogue41G import RewritingProxy
from tether_agentsdk import Agent, Conn

FORGED = {
    "not-the-jws-alphabet": "eyJhbGciOiJFZERTQSJ9!.e30.c2ln",
    "past-max-token-bytes": "eyJ" + "a" * 9000 + ".e30.c2ln",
    "past-the-headers": "eyJ" + "a" * 70_000 + ".e30.c2ln",
}


@pytest.mark.parametrize("credential", list(FORGED.values()), ids=list(FORGED))
def test_rogue44j_a_refreshed_credential_the_control_plane_never_takes_does_not_deafen_or_abort_the_agent(server, operator: Conn, credential):
    root = Agent.register_root(operator, "rogue44j-root")
    child = root.spawn("worker")
    proxy = RewritingProxy(server.url, credential)
    worker = Agent(Conn(proxy.url, child.credential, retry=NO_RETRY), child.node)
    worker.heartbeat_every = 0.2
    try:
        worker.start()
        wait_for("the heartbeat answer the proxy rewrote", proxy.rewritten.is_set)
        terminate(operator, child.node_id, "drain")
        try:
            # A bound on the wait for the drain (the stream relays it at
            # once, the next heartbeat's answer carries it), not a timing.
            wait_for("the operator's drain, after the rewritten answer", worker.draining.is_set)
            assert worker.signal is not None and not worker.signal.abort, \
                f"the agent aborted itself ({worker.signal}), the control plane having refused nothing of its own credential"
        except AssertionError as e:
            with proxy.lock:
                beats, streams = proxy.beats_after, proxy.streams_after
            raise AssertionError(f"{e}: after the rewritten answer {beats} heartbeat(s) and {streams} signals "
                                 f"stream(s) reached the path") from None
        assert worker.credential == child.credential, "the agent took the rewritten credential"
        assert worker.run_error is None, worker.run_error
    finally:
        worker.close()
        proxy.close()
