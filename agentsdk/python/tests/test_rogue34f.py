"""The thirty-fourth hostile pass on the Python SDK's Verifier: a snapshot
answer spans several feed messages when the control plane holds more live
tombstones than one message carries (a thousand), and the verifier
replaced its tombstone set with the first: until the last arrived, a token
whose revocation the copy sent later was accepted. It now keeps its old
set (adding the copy's tombstones to it) until the snapshot's last
message, which says it does not continue."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import NO_RETRY, require_extra, start_server
from helpers import LoopbackPeer, QuietHandler, wait_for
from tether_agentsdk import Agent, Conn, GrantRevoked, Verifier, VerifyError

MAX_FEED_BATCH = 1000
FLAGS = ("--grant-max-per-node", "1100")


def _halt(server) -> None:
    """Stops the server as an operator would (SIGTERM): its store closed whole."""
    server.proc.terminate()
    server.proc.wait(30)


def _revoke_many(op: Conn, name: str, n: int) -> None:
    node = Agent.register_root(op, name)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: op.call("CapabilityService", "IssueRoot", {"holderNodeId": node.node_id, "scopes": ["tool:*"], "ttl": "3600s"}), range(n)))
    res = op.call("CapabilityService", "Revoke", {"holderNodeId": node.node_id, "reason": "filler"})
    assert len(res["revokedGrantIds"]) == n


def test_rogue34f_a_snapshot_in_several_messages_keeps_the_old_set_until_its_last(tether_bin, tmp_path):
    require_extra("cryptography")
    data, backup = tmp_path / "data", tmp_path / "backup"
    data.mkdir()
    server = start_server(tether_bin, data, *FLAGS)
    addr = server.url.removeprefix("http://")
    verifier = None
    try:
        op = server.operator()
        _revoke_many(op, "filler", MAX_FEED_BATCH)
        rogue = Agent.register_root(op, "rogue")
        x = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        op.call("CapabilityService", "Revoke", {"grantId": x["grant"]["grantId"], "reason": "rogue"})
        _halt(server)
        shutil.copytree(data, backup)
        server = start_server(tether_bin, data, *FLAGS, addr=addr)
        op = server.operator()
        later = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        revoked = int(op.call("CapabilityService", "Revoke", {"grantId": later["grant"]["grantId"], "reason": "later"})["sequence"])

        verifier = Verifier(Conn(server.url, server.admin, retry=NO_RETRY), staleness_budget=60)
        restored = threading.Event()
        seen: list[dict] = []
        apply = verifier._apply

        def observed(msg: dict) -> None:
            # What the verifier accepts once it applied each message of the
            # restored server's answer, before it reads the next.
            apply(msg)
            if not restored.is_set():
                return
            try:
                verifier.verify(x["token"])
                accepted = True
            except GrantRevoked:
                accepted = False
            except VerifyError:
                accepted = False  # failing closed is no acceptance
            seen.append({"snapshot": bool(msg.get("snapshot")), "continues": bool(msg.get("continues")),
                         "tombstones": len(msg.get("tombstones", [])), "accepted": accepted})

        verifier._apply = observed
        verifier.start()
        assert verifier.wait_for_sequence(revoked, timeout=30), "the verifier did not reach the later revocation"
        try:
            verifier.verify(x["token"])
            raise AssertionError("before the restore, the rogue's revoked token was accepted")
        except GrantRevoked:
            pass

        # The store restored from the copy taken before the later
        # revocation: the verifier's position is past its head, and it
        # answers with a snapshot of its 1,001 live tombstones.
        _halt(server)
        restored.set()
        server = start_server(tether_bin, backup, *FLAGS, addr=addr)
        deadline = time.monotonic() + 60
        # The snapshot applied moves the head back; the observer notes the
        # message that did it just after (it was read before, and the
        # assertion below saw one message of two).
        while verifier.head != revoked - 1 or not seen or seen[-1]["continues"]:
            assert time.monotonic() < deadline, f"the snapshot was not applied: {seen}"
            time.sleep(0.02)

        assert len(seen) >= 2 and seen[0]["snapshot"] and seen[0]["tombstones"] == MAX_FEED_BATCH, f"the restored server's answer: {seen}"
        assert [m for m in seen if m["accepted"]] == [], f"the verifier accepted the rogue's revoked token between the snapshot's messages: {seen}"
        try:
            verifier.verify(x["token"])
            raise AssertionError("after the snapshot, the rogue's revoked token was accepted")
        except GrantRevoked:
            pass
        verifier.verify(later["token"])  # the restored store never revoked it
    finally:
        if verifier is not None:
            verifier.close()
        server.stop()


class CountingPeer(LoopbackPeer):
    """Answers every unary call {} over HTTP/1.1 keep-alive, counting the
    connections opened and those still open; ``hold`` makes each call wait
    until ``release`` is set; ``close_after`` closes each connection after
    its answer (without saying so), setting ``closed`` once it has."""

    def __init__(self, *, hold: int = 0, close_after: bool = False):
        super().__init__()
        self.opened = 0
        self.open_now = 0
        self.lock = threading.Lock()
        self.arrived = threading.Semaphore(0)
        self.release = threading.Event()
        self.closed = threading.Event()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with peer.lock:
                    peer.opened += 1
                    peer.open_now += 1

            def finish(self):
                try:
                    super().finish()
                    if close_after and self.close_connection:
                        # The server closes the socket only after finish
                        # returns: its end is sent here, before the test
                        # hears it is closed and calls again (else the
                        # next call could go out on it first).
                        try:
                            self.connection.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                finally:
                    with peer.lock:
                        peer.open_now -= 1
                    if close_after:
                        peer.closed.set()

            def do_POST(self):
                self.read_body()
                if hold:
                    peer.arrived.release()
                    peer.release.wait(30)
                self.answer_json({})
                if close_after:
                    self.close_connection = True

        self.serve(Handler)


def test_rogue34f_unary_calls_reuse_a_keep_alive_connection():
    peer = CountingPeer()
    try:
        conn = Conn(peer.url, "t", retry=NO_RETRY)
        for _ in range(20):
            assert conn.call("AgentService", "GetNode", {"nodeId": "n"}) == {}
        assert peer.opened == 1, f"20 calls one after another opened {peer.opened} connections"
        conn.close()
        wait_for("the idle connection closed", lambda: peer.open_now == 0)
    finally:
        peer.close()


def test_rogue34f_idle_connections_are_bounded():
    import tether_agentsdk._connect as connect

    peer = CountingPeer(hold=1)
    try:
        conn = Conn(peer.url, "t", retry=NO_RETRY)
        n = 2 * connect.MAX_IDLE_CONNECTIONS
        with ThreadPoolExecutor(n) as pool:
            calls = [pool.submit(conn.call, "AgentService", "GetNode", {}) for _ in range(n)]
            for _ in range(n):
                assert peer.arrived.acquire(timeout=30), "the calls did not all arrive together"
            peer.release.set()
            assert [c.result(30) for c in calls] == [{}] * n
        assert peer.opened == n
        wait_for(f"the idle connections down to {connect.MAX_IDLE_CONNECTIONS}", lambda: peer.open_now <= connect.MAX_IDLE_CONNECTIONS)
        for _ in range(n):
            conn.call("AgentService", "GetNode", {})
        assert peer.opened == n, f"calls one after another opened {peer.opened - n} more connections, with idle ones kept"
        conn.close()
    finally:
        peer.close()


def test_rogue34f_a_connection_the_peer_closed_is_not_used_again():
    peer = CountingPeer(close_after=True)
    try:
        conn = Conn(peer.url, "t", retry=NO_RETRY)
        for i in range(3):
            assert conn.call("AgentService", "GetNode", {}) == {}
            assert peer.closed.wait(30), "the peer did not close its connection"
            peer.closed.clear()
        assert peer.opened == 3
    finally:
        peer.close()


def test_rogue34f_the_real_server_answers_calls_on_a_reused_connection(server):
    # Calls of several kinds one after another on one Conn, on the
    # connections it keeps: every answer is the call's own.
    op = server.operator()
    node = Agent.register_root(op, "rogue34f-reuse")
    for i in range(5):
        got = op.call("AgentService", "GetNode", {"nodeId": node.node_id})
        assert got["node"]["nodeId"] == node.node_id
        issued = op.call("CapabilityService", "IssueRoot", {"holderNodeId": node.node_id, "scopes": ["tool:a"], "ttl": "60s"})
        assert issued["grant"]["holderNodeId"] == node.node_id
    op.close()


def test_rogue34f_a_verifier_starting_is_not_ready_before_the_feeds_head(tether_bin, tmp_path):
    """A verifier that starts (opens the feed at 0) behind 1,001 live
    tombstones is sent them in two messages, the rogue's in the second: it
    was ready, and fresh, with the first, and accepted the rogue's revoked
    token until the second arrived. A message that continues now neither
    readies nor refreshes it."""
    require_extra("cryptography")
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(tether_bin, data, *FLAGS)
    verifier = None
    try:
        op = server.operator()
        _revoke_many(op, "filler", MAX_FEED_BATCH)
        rogue = Agent.register_root(op, "rogue")
        x = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        revoked = int(op.call("CapabilityService", "Revoke", {"grantId": x["grant"]["grantId"], "reason": "rogue"})["sequence"])
        verifier = Verifier(Conn(server.url, server.admin, retry=NO_RETRY), staleness_budget=60)
        seen: list[dict] = []
        apply = verifier._apply

        def observed(msg: dict) -> None:
            apply(msg)
            try:
                verifier.verify(x["token"])
                accepted = True
            except VerifyError:
                accepted = False
            seen.append({"continues": bool(msg.get("continues")), "tombstones": len(msg.get("tombstones", [])), "accepted": accepted})

        verifier._apply = observed
        verifier.start()
        assert verifier.wait_for_sequence(revoked, timeout=30), "the verifier did not reach the rogue's revocation"
        wait_for("the feed's messages observed", lambda: len(seen) >= 2)
        assert seen[0]["tombstones"] == MAX_FEED_BATCH, f"the feed opened at 0: {seen}"
        assert [m for m in seen if m["accepted"]] == [], f"the starting verifier accepted the rogue's revoked token before the feed's head: {seen}"
        try:
            verifier.verify(x["token"])
            raise AssertionError("at the feed's head, the rogue's revoked token was accepted")
        except GrantRevoked:
            pass
    finally:
        if verifier is not None:
            verifier.close()
        server.stop()
