"""The core: standard library only, the Connect JSON wire, errors."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tether_agentsdk import Agent, ConnectError, Conn
from tether_agentsdk import _wire

SRC = Path(__file__).resolve().parents[1] / "src"


def test_core_imports_only_the_standard_library():
    # A fresh interpreter without site-packages: importing the core (and its
    # verifier, whose cryptography import is optional) must load nothing
    # outside the standard library.
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "before = set(sys.modules)\n"
        "import tether_agentsdk, tether_agentsdk.verifier, tether_agentsdk.leaseworker\n"
        "loaded = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "foreign = sorted(m for m in loaded if m not in sys.stdlib_module_names and m != 'tether_agentsdk' and not m.startswith('_'))\n"
        "print(','.join(foreign))\n"
    ) % str(SRC)
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "", f"the core imported third-party modules: {out.stdout.strip()}"


def test_wire_durations_and_timestamps():
    assert _wire.duration(1.5) == "1.5s"
    assert _wire.duration(timedelta(minutes=10)) == "600s"
    assert _wire.duration(0) == "0s"
    assert _wire.parse_duration("0.250s") == timedelta(milliseconds=250)
    ts = _wire.parse_timestamp("2026-11-30T12:00:00.123456789Z")
    assert ts == datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=timezone.utc)
    assert _wire.parse_timestamp("2026-11-30T13:00:00+01:00") == datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert _wire.parse_timestamp(_wire.timestamp(ts)) == ts
    with pytest.raises(ValueError):
        _wire.parse_timestamp("yesterday")
    assert _wire.uint64("18446744073709551615") == 2**64 - 1


def test_errors_carry_the_connect_code(server, operator):
    anonymous = Conn(server.url)
    with pytest.raises(ConnectError) as e:
        anonymous.call("AuthService", "WhoAmI", {})
    assert e.value.code == "unauthenticated"

    forged = Conn(server.url, "not.a.token")
    with pytest.raises(ConnectError) as e:
        forged.call("AuthService", "WhoAmI", {})
    assert e.value.code == "unauthenticated"
    assert "not.a.token" not in str(e.value)

    with pytest.raises(ConnectError) as e:
        operator.call("AgentService", "GetNode", {"nodeId": "n_doesnotexist"})
    assert e.value.code in ("not_found", "invalid_argument")

    with pytest.raises(ConnectError) as e:
        operator.call("AgentService", "NoSuchMethod", {})
    assert e.value.code == "unimplemented"

    with pytest.raises(ConnectError) as e:
        operator.call("AgentService", "RegisterRoot", {"name": "bad name with spaces"})
    assert e.value.code == "invalid_argument"
    assert e.value.message


def test_server_stream_errors_arrive_at_the_end_of_the_stream(server, operator):
    # An operator is not an agent: the signal stream refuses it in its
    # end-of-stream message.
    with pytest.raises(ConnectError) as e:
        for _ in operator.stream("AgentService", "WatchSignals", {}):
            pass
    assert e.value.code == "permission_denied"


def test_unreachable_server_is_unavailable():
    with pytest.raises(ConnectError) as e:
        Conn("http://127.0.0.1:1", "x", timeout=2).call("AuthService", "WhoAmI", {})
    assert e.value.code == "unavailable"


def test_register_spawn_join_and_confirm_exit(server, tree):
    child = tree.root.spawn("retriever", {"team": "research"})
    assert child.node["parentNodeId"] == tree.root.node_id
    me = Agent.join(server.url, child.credential)
    assert me.node_id == child.node_id
    assert me.node["labels"] == {"team": "research"}
    with pytest.raises(ValueError):
        Agent.join(server.url, server.admin)
    # A sibling's credential cannot act for the child.
    sibling = tree.root.spawn("sibling")
    with pytest.raises(ConnectError) as e:
        Conn(server.url, sibling.credential).call("AgentService", "ConfirmExit", {"nodeId": child.node_id})
    assert e.value.code == "permission_denied"
    node = me.confirm_exit("done")
    assert node["exitedAt"] and node["exitConfirmedBy"].endswith("(self)")


def test_a_token_a_header_cannot_carry_is_refused_without_quoting_it(server):
    # A token read from a file with its newline, or one carrying a CRLF and
    # a header of its own: nothing is sent, and the error never quotes the
    # token (http.client's own ValueError quoted the whole header value).
    # Go's SDK refuses both without the value too.
    for bad in (server.admin + "\n", server.admin + "\r\nX-Evil: 1", server.admin[:20] + " " + server.admin[20:]):
        conn = Conn(server.url, bad)
        with pytest.raises(ConnectError) as e:
            conn.call("AuthService", "ListTokens", {})
        assert e.value.code == "unauthenticated"
        assert server.admin[:40] not in str(e.value) and "trim" in str(e.value)
        with pytest.raises(ConnectError) as e:
            next(iter(conn.stream("CapabilityService", "WatchRevocations", {})))
        assert e.value.code == "unauthenticated" and server.admin[:40] not in str(e.value)
    assert Conn(server.url, server.admin).call("AuthService", "ListTokens", {}) is not None
