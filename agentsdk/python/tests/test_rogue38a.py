"""The thirty-eighth hostile pass on the agent SDKs, the Python SDK's part:
an honest parent (or operator) lists the subtree of its rogue child, who
spawned children carrying every label allowed until the subtree is one
answer larger than a connection reads."""

from __future__ import annotations

from datetime import timedelta

import pytest

from helpers import terminate, wait_for
from tether_agentsdk import Agent, ConnectError, Conn, _connect, _wire, list_subtree
from tether_agentsdk._connect import RESOURCE_EXHAUSTED


def _full_labels(i: int) -> dict[str, str]:
    labels = {"team": "rogue"}
    k = 0
    while len(labels) < 32:
        labels[f"k{k:02d}"] = f"{i:02d}-" + "v" * 60
        k += 1
    return labels


def test_rogue38a_list_subtree_lists_a_rogues_large_subtree_a_page_at_a_time(server, tree, monkeypatch):
    parent = tree.root
    rogue = Agent.join(server.url, parent.spawn("rogue38a-rogue").credential)
    count = 40
    resp = rogue.conn.call("AgentService", "SpawnBatch", {"parentNodeId": rogue.node_id, "children": [
        {"name": f"grandchild-{i:02d}", "labels": _full_labels(i)} for i in range(count)]})
    want = {parent.node_id, rogue.node_id} | {s["node"]["nodeId"] for s in resp["spawned"]}

    # Answers of at most 48 KiB (about 13 of the rogue's children as JSON),
    # as a rogue subtree of ~3,800 such nodes exceeds 16 MiB: the subtree
    # stays small.
    monkeypatch.setattr(_connect, "MAX_MESSAGE_BYTES", 48 << 10)
    for who, conn in (("parent", Conn(server.url, parent.credential)), ("operator", server.operator())):
        with pytest.raises(ConnectError) as refused:
            conn.call("AgentService", "ListNodes", {"rootNodeId": parent.node_id})
        assert refused.value.code == RESOURCE_EXHAUSTED, (who, refused.value)
        nodes = list_subtree(conn, parent.node_id, page_size=8)
        ids = [n["nodeId"] for n in nodes]
        assert len(ids) == len(set(ids)), f"{who}: a node listed twice"
        assert set(ids) == want, f"{who}: list_subtree must list the subtree completely"
        selected = list_subtree(conn, parent.node_id, "team=rogue", page_size=8)
        assert len(selected) == count, f"{who}: the selector applies to every page"
        conn.close()
    assert len(list_subtree(rogue.conn, page_size=8)) == count + 1, "the rogue's own subtree when no root is named"
    rogue.conn.close()


def test_rogue38a_a_child_is_told_the_confirm_deadline_when_its_drain_ends_at_the_mark(server, tree):
    # A rogue parent drains its honest child with a day's drain window and a
    # minute's wait for its exit. The child has no call in flight: its drain
    # ends at the mark, its grants are revoked, the record waits a minute;
    # no node changes then, so the signals stream told it no deadline or
    # the day's. Heartbeats (whose answers read it) are off here: the
    # stream must tell it the minute's.
    child = Agent.join(server.url, tree.root.spawn("rogue38a-child").credential)
    child.heartbeat_every = 86400
    with child:
        assert child.opened.wait(10)
        asked = terminate(tree.root.conn, child.node_id, "drain", window="86400s", confirm="60s")
        wait_for("the minute's confirmation deadline",
                 lambda: child.drain_deadline is not None
                 and child.drain_deadline < _wire.parse_timestamp(asked["requestedAt"]) + timedelta(hours=1), timeout=50)
