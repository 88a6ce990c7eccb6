"""The forty-first hostile pass on the Python SDK.

A heartbeat's answer may carry a refreshed credential, and the agent took
whatever it carried as the bearer token of every later call: one answer of
the wrong shape (a proxy's, a hostile peer's on the path to the control
plane) left the agent with a "credential" that is no token. Not text (a
number, an object), and every later heartbeat and every reconnect of the
signals stream failed before it left the process (TypeError), for good,
the path healthy again or not: the agent never heard its stop, its work
going on after it. Text a header cannot carry (a space, a line break), and
the SDK refused its own next call unauthenticated, took that for the
control plane's refusal of a dead credential and aborted the agent
itself, its heartbeats and stream stopped: a stop nobody ordered. The Go
SDK decodes the answer as a typed message (a credential that is not text
fails the message, the credential kept); the Python SDK now keeps its
credential unless the answer's is a bearer token a header can carry, as
the fortieth pass had it keep its node id (rogue40H test).
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse

import pytest

from conftest import NO_RETRY
from helpers import LoopbackPeer, QuietHandler, relay_end, terminate, wait_for
from tether_agentsdk import Agent, Conn


class RewritingProxy(LoopbackPeer):
    """A relay on loopback in front of the real server (the path between an
    agent and its control plane) that rewrites one answer: the first
    heartbeat's, whose credential becomes ``credential``. Until then it
    answers a signals stream 503 (a path not yet through), so that the
    agent's stream is opened after the answer; everything else, and
    everything after it, it relays as it came."""

    def __init__(self, upstream: str, credential: object):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.rewritten = threading.Event()
        self.lock = threading.Lock()
        self.beats_after = 0  # heartbeats relayed after the rewritten one
        self.streams_after = 0  # signals streams relayed after it
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                if method == "WatchSignals" and not peer.rewritten.is_set():
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                up = http.client.HTTPConnection(peer.upstream.hostname, peer.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                up.request("POST", self.path, body=body, headers=headers)
                if method == "Heartbeat":
                    with peer.lock:
                        rewrite = not peer.rewritten.is_set()
                        if not rewrite:
                            peer.beats_after += 1
                    if rewrite:
                        resp = up.getresponse()
                        answer = json.loads(resp.read())
                        up.close()
                        assert resp.status == 200, answer
                        answer["credential"] = {"credential": credential, "expiresAt": "2999-01-01T00:00:00Z"}
                        self.answer_json(answer)
                        peer.rewritten.set()
                        return
                if method == "WatchSignals":
                    with peer.lock:
                        peer.streams_after += 1
                    threading.Thread(target=relay_end, args=(self.connection, up.sock), daemon=True).start()
                self.relay_answer(up)

        self.serve(Handler)


@pytest.mark.parametrize("credential", [12345, {"credential": "a.b.c"}, "a credential\r\nX-Injected: 1"],
                         ids=["a-number", "an-object", "text-a-header-cannot-carry"])
def test_rogue41G_a_heartbeat_answer_of_the_wrong_shape_does_not_deafen_or_abort_the_agent(server, operator: Conn, credential):
    root = Agent.register_root(operator, "rogue41g-root")
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
                f"the agent aborted itself ({worker.signal}), the control plane having refused nothing"
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
