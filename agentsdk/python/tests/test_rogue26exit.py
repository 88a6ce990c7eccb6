"""The twenty-sixth hostile pass on the Python SDK, the honest side of a
hardening: the control plane confirms an agent's bare exit claim only when
the session end it saw was the last it saw of the node (a heartbeat after
that end, of a rogue living on without a session, leaves the claim a
claim). The Python SDK heartbeats by unary calls beside its signals stream,
so an honest agent must see to it that its last heartbeat lands before the
session end the record weighs."""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse

from helpers import LoopbackPeer, QuietHandler, relay_end, terminate, wait_for
from tether_agentsdk import Agent, Conn
from tether_agentsdk._wire import parse_timestamp


class CuttingProxy(LoopbackPeer):
    """A relay on loopback in front of the real server (the network path
    between an agent and its control plane). It holds each heartbeat until
    ``beats`` is set; ``cut()`` breaks the signals streams it relays (a
    restart, a load balancer dropping a long stream); a signals stream
    opened while ``partitioned`` is set is held, never relayed (a reconnect
    lost on a dead path)."""

    def __init__(self, upstream: str):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.beats = threading.Event()
        self.partitioned = threading.Event()
        self.lock = threading.Lock()
        self.streams: list[tuple[socket.socket, http.client.HTTPConnection]] = []
        self.held_streams = 0
        self.held_beats = 0
        self.beats_answered = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                if method == "WatchSignals" and peer.partitioned.is_set():
                    with peer.lock:
                        peer.held_streams += 1
                    peer.closing.wait()
                    return
                if method == "Heartbeat":
                    with peer.lock:
                        peer.held_beats += 1
                    while not peer.beats.wait(0.05):
                        if peer.closing.is_set():
                            return
                    with peer.lock:
                        peer.held_beats -= 1
                up = http.client.HTTPConnection(peer.upstream.hostname, peer.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                up.request("POST", self.path, body=body, headers=headers)
                if method == "WatchSignals":
                    with peer.lock:
                        peer.streams.append((self.connection, up))
                    # The client's end of the stream is relayed too, as a
                    # path does: its connection closing ends the upstream.
                    threading.Thread(target=relay_end, args=(self.connection, up.sock), daemon=True).start()
                self.relay_answer(up)
                if method == "Heartbeat":
                    with peer.lock:
                        peer.beats_answered += 1

        self.serve(Handler)

    def cut(self) -> None:
        """Breaks every signals stream relayed so far, on both sides."""
        with self.lock:
            streams, self.streams = self.streams, []
        for client, up in streams:
            for sock in (client, up.sock):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def count(self, what: str) -> int:
        with self.lock:
            return getattr(self, what)


def _node(operator: Conn, node_id: str) -> dict:
    return operator.call("AgentService", "GetNode", {"nodeId": node_id})["node"]


def _record_of(operator: Conn, termination_id: str, node_id: str) -> dict:
    with operator.stream("SupervisorService", "WatchTermination", {"terminationId": termination_id}, read_timeout=60) as watch:
        for msg in watch:
            if msg.get("termination", {}).get("state") == "TERMINATION_STATE_TERMINATED":
                break
    record = operator.call("SupervisorService", "GetRecord", {"terminationId": termination_id})["record"]
    return next(n for n in record["nodes"] if n["nodeId"] == node_id)


def test_an_honest_agent_whose_stream_broke_is_confirmed_by_its_exit(server, tree):
    """An honest agent's signals stream breaks (its control plane restarted,
    or the path dropped the stream); the control plane sees that session
    end. Its heartbeats go on meanwhile, beside the stream, and one lands
    after that end; its reconnect is not through yet when the agent drains
    and confirms its exit. confirm_exit stopped the heartbeats and closed a
    stream that was already dead, then claimed: the last session end the
    control plane saw came before the agent's last heartbeat, and the
    record counted the honest agent UNACCOUNTED ("seen alive after its
    session ended"), as a rogue that lives on without a session. Its
    confirm_exit now ends a session of its own after its last heartbeat."""
    child = tree.root.spawn("r26-stream-broke")
    proxy = CuttingProxy(server.url)
    me = Agent.join(proxy.url, child.credential)
    me.heartbeat_every = 0.2
    try:
        me.start()
        assert me.opened.wait(10), "the agent's signals stream did not open"
        wait_for("the agent's first heartbeat to reach the path", lambda: proxy.count("held_beats") > 0)
        # The stream breaks; its reconnect is lost on the path.
        proxy.partitioned.set()
        proxy.cut()
        wait_for("the control plane to see the session end",
                 lambda: _node(tree.operator, child.node_id).get("sessionClosedAt") and not _node(tree.operator, child.node_id).get("openSessions"))
        wait_for("the agent's reconnect to be held on the path", lambda: proxy.count("held_streams") > 0)
        # Its heartbeats, beside the stream, go through: one lands after
        # the session's end.
        proxy.beats.set()
        wait_for("a heartbeat to land", lambda: proxy.count("beats_answered") > 0)
        n = _node(tree.operator, child.node_id)
        assert parse_timestamp(n["lastSeenAt"]) > parse_timestamp(n["sessionClosedAt"]), n
        # The path heals for what comes next; the lost reconnect stays lost.
        proxy.partitioned.clear()
        term = terminate(tree.operator, child.node_id, "drain", confirm="30s")
        assert me.draining.wait(10), "the agent was not told to drain"
        me.confirm_exit("drained")
        rn = _record_of(tree.operator, term["terminationId"], child.node_id)
        assert rn.get("outcome") == "NODE_OUTCOME_CONFIRMED" and rn.get("confirmedBy") == "control-plane", (
            f"an honest agent whose stream broke reads {rn.get('outcome')}: {rn.get('unaccountedReason', '')}")
    finally:
        me.close()
        proxy.close()


def test_a_heartbeat_in_flight_at_confirm_exit_lands_before_the_session_ends(server, tree):
    """Guard: an honest agent confirms its exit while a heartbeat of its is
    in flight (sent, not yet answered). That heartbeat must land before the
    session end the record weighs, and before the claim (a heartbeat after
    the claim is refused and kept as evidence against it). The heartbeat is
    held on the path until confirm_exit has begun; the record must say the
    control plane confirmed the exit."""
    child = tree.root.spawn("r26-beat-in-flight")
    proxy = CuttingProxy(server.url)
    me = Agent.join(proxy.url, child.credential)
    me.heartbeat_every = 0.2
    try:
        me.start()
        assert me.opened.wait(10), "the agent's signals stream did not open"
        term = terminate(tree.operator, child.node_id, "drain", confirm="30s")
        assert me.draining.wait(10), "the agent was not told to drain"
        wait_for("a heartbeat to be in flight", lambda: proxy.count("held_beats") > 0)
        claimed: dict = {}

        def claim() -> None:
            try:
                claimed["node"] = me.confirm_exit("drained")
            except BaseException as e:  # reported by the test's thread
                claimed["error"] = e

        t = threading.Thread(target=claim, daemon=True)
        t.start()
        wait_for("confirm_exit to begin", me._stop.is_set)
        proxy.beats.set()
        t.join(60)
        assert not t.is_alive(), "confirm_exit did not return"
        assert "error" not in claimed, claimed.get("error")
        assert proxy.count("beats_answered") > 0, "the heartbeat in flight was never answered"
        rn = _record_of(tree.operator, term["terminationId"], child.node_id)
        assert rn.get("outcome") == "NODE_OUTCOME_CONFIRMED" and rn.get("confirmedBy") == "control-plane", (
            f"an honest agent with a heartbeat in flight at its exit reads {rn.get('outcome')}: {rn.get('unaccountedReason', '')}")
    finally:
        me.close()
        proxy.close()
