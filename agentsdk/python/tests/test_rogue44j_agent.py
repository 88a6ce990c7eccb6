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

from helpers import check_a_rewritten_credential_is_not_taken
from tether_agentsdk import Conn

FORGED = {
    "not-the-jws-alphabet": "eyJhbGciOiJFZERTQSJ9!.e30.c2ln",
    "past-max-token-bytes": "eyJ" + "a" * 9000 + ".e30.c2ln",
    "past-the-headers": "eyJ" + "a" * 70_000 + ".e30.c2ln",
}


@pytest.mark.parametrize("credential", list(FORGED.values()), ids=list(FORGED))
def test_rogue44j_a_refreshed_credential_the_control_plane_never_takes_does_not_deafen_or_abort_the_agent(server, operator: Conn, credential):
    check_a_rewritten_credential_is_not_taken(server.url, operator, "rogue44j-root", credential)
