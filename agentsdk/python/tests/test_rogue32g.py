"""A flake audit of the Python tests' server, as the Go tests' (internal/
freeport, TestMembersPortsAreNotTheKernelsToHandOut): the port a ``tether
serve`` is started on came from a bind to port 0, in the kernel's ephemeral
range, released before the server bound it; in between the kernel could
hand it to any listen on port 0 or outgoing connection of any process
(this one's own clients and loopback peers included), and the server exited
"address already in use" (the TypeScript tests' server was seen so)."""

from __future__ import annotations

import pytest

from conftest import PORT_FLOOR, _ephemeral_low, _free_port


def test_rogue32g_the_servers_port_is_not_the_kernels_to_hand_out():
    low = _ephemeral_low()
    if low <= PORT_FLOOR:
        pytest.skip(f"no room below the ephemeral range (it starts at {low})")
    for _ in range(20):
        port = _free_port()
        assert PORT_FLOOR <= port < low, (
            f"port {port} is in the kernel's ephemeral range (from {low}): it may be handed out before the server binds it")
