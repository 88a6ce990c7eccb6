"""The thirty-second hostile pass on the Python SDK: a rogue on the honest
agents' address (a NAT, a shared host) spends the address's budget for
requests without a valid credential with forged tokens; an honest child
joining with its fresh credential (which must be verified, paid from that
budget) was refused resource_exhausted and the SDK raised it at the agent,
though the refusal said when to come back (Retry-After). A unary call
refused resource_exhausted with a retry hint is now sent again after the
hint, a bounded number of times."""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest import Server, start_server
from tether_agentsdk import DEFAULT_RETRY, Agent, ConnectError, Conn, Retry


# Children spawned before the limited server's start (fresh_child): a
# credential the control plane minted is remembered as verified as it is
# minted (since the thirty-third pass), so a child's credential not yet
# verified is one kept across a restart.
_children: list[dict] = []


@pytest.fixture(scope="module")
def limited(tether_bin: str, tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("tether-rogue32e")
    s = start_server(tether_bin, data)
    parent = s.operator().call("AgentService", "RegisterRoot", {"name": "parent"})
    spawner = Conn(s.url, parent["credential"])
    _children[:] = [spawner.call("AgentService", "Spawn", {"parentNodeId": parent["node"]["nodeId"], "name": f"child{k}"}) for k in range(3)]
    s.stop()
    # Half a request a second: bursts of one, the next two seconds later.
    s = start_server(tether_bin, data, "--anonymous-rate-limit", "0.5")
    yield s
    s.stop()


def forged(token: str, n: int) -> str:
    """token with one character of its signature changed: well formed,
    refused once verified."""
    i = len(token) - 2 - n % 40
    c = "B" if token[i] == "A" else "A"
    return token[:i] + c + token[i + 1:]


def fresh_child(server: Server) -> dict:
    """A child whose credential the server has not verified (each test's own)."""
    return _children.pop()


def spend(server: Server, credential: str) -> None:
    """Has a rogue spend the address's budget."""
    for k in range(16):
        try:
            Conn(server.url, forged(credential, k), retry=Retry(attempts=1)).call("AuthService", "WhoAmI", {})
        except ConnectError as e:
            if e.code == "resource_exhausted":
                return
            assert e.code == "unauthenticated", e
        else:
            pytest.fail("a forged token was admitted")
    pytest.fail("16 forged tokens never spent the address's budget")


def test_rogue32e_without_retries_a_join_is_refused_with_the_hint(limited: Server):
    child = fresh_child(limited)
    spend(limited, child["credential"])
    with pytest.raises(ConnectError) as e:
        Agent.join(limited.url, child["credential"], retry=Retry(attempts=1))
    assert e.value.code == "resource_exhausted"
    assert e.value.retry_after is not None and 0 < e.value.retry_after <= 2


def test_rogue32e_a_join_refused_by_the_addresses_budget_is_retried_after_the_hint(limited: Server):
    child = fresh_child(limited)
    spend(limited, child["credential"])
    waits: list[float] = []

    def sleep(d: float) -> None:
        waits.append(d)
        time.sleep(d)  # the SDK's own wait: the server's budget refills with time

    agent = Agent.join(limited.url, child["credential"], retry=dataclasses.replace(DEFAULT_RETRY, sleep=sleep, jitter=lambda: 0.0))
    assert agent.node_id == child["node"]["nodeId"]
    assert len(waits) == 1 and 0 < waits[0] <= 2, waits


def test_rogue32e_a_budget_kept_spent_is_retried_a_bounded_number_of_times(limited: Server):
    child = fresh_child(limited)
    spend(limited, child["credential"])
    waits: list[float] = []
    # No time passes between attempts: the budget stays spent.
    with pytest.raises(ConnectError) as e:
        Agent.join(limited.url, child["credential"], retry=dataclasses.replace(DEFAULT_RETRY, sleep=waits.append))
    assert e.value.code == "resource_exhausted"
    assert len(waits) == DEFAULT_RETRY.attempts - 1
    # A timeout shorter than the hint: refused at once.
    waits.clear()
    with pytest.raises(ConnectError) as e:
        Conn(limited.url, child["credential"], timeout=0.5, retry=dataclasses.replace(DEFAULT_RETRY, sleep=waits.append)).call("AuthService", "WhoAmI", {})
    assert e.value.code == "resource_exhausted" and waits == []


def test_rogue32e_a_refusal_without_a_hint_has_none():
    assert ConnectError("resource_exhausted", "too many streams").retry_after is None
    assert ConnectError("unavailable", "x", retry_after=3).retry_after is None
