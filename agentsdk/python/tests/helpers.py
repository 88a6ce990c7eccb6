"""Helpers shared by the tests (all against the real server)."""

from __future__ import annotations

import http.client
import http.server
import json
import queue
import socket
import struct
import threading
import time
import urllib.parse
from typing import Callable

from conftest import NO_RETRY
from tether_agentsdk import Agent, Conn, ToolCallCancelled, ToolGate, current_call


def terminate(operator: Conn, node_id: str, mode: str = "drain", *, window: str = "60s", ack: str = "30s", confirm: str = "60s") -> dict:
    return operator.call("SupervisorService", "Terminate", {
        "nodeId": node_id, "mode": "TERMINATION_MODE_" + mode.upper(), "reason": "test",
        "drainWindow": window, "cancelAckTimeout": ack, "confirmTimeout": confirm,
    })["termination"]


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    """Polls a condition that the server (another process) makes true; a
    bound, never a stand-in for synchronisation."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def tool_calls(operator: Conn, termination_id: str) -> list[dict]:
    """The tool calls a termination's record lists."""
    rec = operator.call("SupervisorService", "GetRecord", {"terminationId": termination_id})["record"]
    return rec.get("toolCalls", [])


def drained_root_record(tree) -> dict:
    """The operator drains the tree's root, the root confirms its exit, and
    the termination's record once it is terminated."""
    term = terminate(tree.operator, tree.root.node_id, "drain", confirm="1s")
    tree.root.confirm_exit("drained")
    with tree.operator.stream("SupervisorService", "WatchTermination", {"terminationId": term["terminationId"]}, read_timeout=60) as watch:
        for msg in watch:
            if msg.get("termination", {}).get("state") == "TERMINATION_STATE_TERMINATED":
                break
    return tree.operator.call("SupervisorService", "GetRecord", {"terminationId": term["terminationId"]})["record"]


def drain_tool(tree):
    """An openai-agents function tool `drain` that has the operator drain
    the tree's root and returns once the root is told to drain."""
    from agents import function_tool  # the openai-agents extra, required by its caller

    @function_tool
    def drain(x: str) -> str:
        """Drains the run."""
        terminate(tree.operator, tree.root.node_id, "drain")
        assert tree.root.draining.wait(10)
        return "drained"

    return drain


def abort_child_tool(tree, tether, *, confirm: str = "60s"):
    """An openai-agents function tool `abort` that has the operator abort
    the only child tether spawned and returns once the child is aborting."""
    from agents import function_tool  # the openai-agents extra, required by its caller

    @function_tool
    def abort(x: str) -> str:
        """Aborts the run's child."""
        [(child, _)] = tether.children
        terminate(tree.operator, child.node_id, "abort", confirm=confirm)
        wait_for("the child aborting", lambda: tree.operator.call(
            "AgentService", "GetNode", {"nodeId": child.node_id})["node"]["state"] in (
            "NODE_STATE_ABORTING", "NODE_STATE_TERMINATED"))
        return "aborted"

    return abort


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler for a test's peer: logs nothing, and has the two
    steps every peer takes (read the request's body, answer a JSON object)."""

    def log_message(self, *args):  # quiet
        pass

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer_json(self, answer: dict, status: int = 200) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def forward(self, upstream: urllib.parse.SplitResult, body: bytes) -> http.client.HTTPConnection:
        """Sends the request on to upstream, as a path does: its path, its
        headers (bar the hop-by-hop ones) and body; returns the connection
        its answer comes on."""
        up = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        up.request("POST", self.path, body=body, headers=headers)
        return up

    def answer_whole(self, resp: http.client.HTTPResponse, data: bytes) -> None:
        """Answers with resp's status and headers (bar the hop-by-hop ones)
        and data, read whole (and perhaps rewritten), as its body."""
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def relay_head(self, resp: http.client.HTTPResponse) -> None:
        """Relays resp's status and headers (bar the hop-by-hop ones), as a
        path does, and ends the headers: the body is the caller's."""
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "date", "server"):
                self.send_header(k, v)
        self.end_headers()

    def relay_answer(self, up: http.client.HTTPConnection) -> None:
        """Relays the answer of the request sent on up, as a path does:
        its status, its headers (bar the hop-by-hop ones), its body as it
        streams; then closes up."""
        resp = up.getresponse()
        self.relay_head(resp)
        try:
            while chunk := resp.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
        except (OSError, http.client.HTTPException):
            pass  # either side left: the relayed stream ends here
        finally:
            up.close()


def relay_end(client: socket.socket, upstream: socket.socket | None) -> None:
    """Relays the end of a client's stream to its upstream, as a path
    does: once the client's connection closes (or breaks), the upstream's
    is shut, so the control plane sees the stream end."""
    try:
        while client.recv(4096):
            pass
    except OSError:
        pass
    if upstream is not None:
        try:
            upstream.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class LoopbackPeer:
    """A loopback HTTP server standing where the control plane would be (a
    peer that misbehaves, or a proxy in front of the real server). A
    subclass builds its handler class and calls serve; ``closing`` is set
    when the test ends, for handlers that hold their answers until then."""

    def __init__(self) -> None:
        self.closing = threading.Event()

    def serve(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


class WatchCancelsPath(LoopbackPeer):
    """A relay on loopback in front of the real server (a tool server's
    path to its control plane) that relays every request as it came, bar
    the gate's WatchCancels streams: it counts those, and hands each to
    ``watch`` (which relays it as it came, its end too, unless a subclass
    holds it)."""

    def __init__(self, upstream: str):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.lock = threading.Lock()
        self.watches = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                up = self.forward(peer.upstream, body)
                if not self.path.endswith("/WatchCancels"):
                    self.relay_answer(up)
                    return
                with peer.lock:
                    peer.watches += 1
                    n = peer.watches
                peer.watch(self, up, n)

        self.serve(Handler)

    def watch(self, handler: QuietHandler, up: http.client.HTTPConnection, n: int) -> None:
        """Relays the WatchCancels stream numbered n (from 1) sent on up."""
        threading.Thread(target=relay_end, args=(handler.connection, up.sock), daemon=True).start()
        handler.relay_answer(up)

    def streams(self) -> int:
        """How many WatchCancels streams the gate asked for."""
        with self.lock:
            return self.watches


# The renew loop's tick for a test that waits for the answer to one of the
# loop's renewals (a renewal counted, a cancel request, a refusal): the tick
# is also each renewal's deadline, so it is a guard against an answer that
# never comes, not a timing — a second, not the 50 or 100 ms a loaded
# machine's answers exceed, with which every renewal failed
# deadline_exceeded and the job never heard the answer it waited for.
LOOP_RENEW_EVERY = 1.0


def connect_envelope(msg: dict) -> bytes:
    """One Connect streaming envelope of msg as JSON."""
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data


class FloodingFeedPeer(LoopbackPeer):
    """A control plane whose WatchRevocations answers a rogue's
    revocation flood: flood feed messages of one tombstone each (as a
    mass revocation or a loop of revocations comes), then holds the
    stream open until the test ends. The key set is empty."""

    def __init__(self, flood: int):
        super().__init__()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                self.answer_json({"keys": []})

            def do_POST(self):
                self.read_body()
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.end_headers()
                try:
                    for n in range(1, flood + 1):
                        self.wfile.write(connect_envelope({"headSequence": str(n), "tombstones": [
                            {"grantId": f"g-{n}", "sequence": str(n), "dropAfter": "2999-01-01T00:00:00Z"}]}))
                    self.wfile.flush()
                    peer.closing.wait()
                except OSError:
                    pass

        self.serve(Handler)


class HeldBeginPeer(LoopbackPeer):
    """Answers a gate: its WatchCancels stays open and carries the bytes
    the test puts on ``orders``; the first BeginCall is answered with
    first_call_id, the second waits for ``begin_answer``."""

    def __init__(self, first_call_id: str):
        self.watching = threading.Event()
        self.begins = 0
        self.second_begun = threading.Event()
        self.orders: queue.Queue = queue.Queue()
        self.begin_answer: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        super().__init__()
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                if method == "WatchCancels":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json")
                    self.end_headers()
                    self.wfile.flush()
                    peer.watching.set()
                    while not peer.closing.is_set():
                        try:
                            payload = peer.orders.get(timeout=0.1)
                        except queue.Empty:
                            continue
                        self.wfile.write(payload)
                        self.wfile.flush()
                    return
                if method == "BeginCall":
                    with peer.lock:
                        peer.begins += 1
                        n = peer.begins
                    if n == 1:
                        answer = {"call": {"callId": first_call_id, "tool": "shell"}}
                    else:
                        peer.second_begun.set()
                        answer = peer.begin_answer.get()
                else:
                    answer = {}
                self.answer_json(answer)

        self.serve(Handler)

    def close(self) -> None:
        self.begin_answer.put({})
        super().close()


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
                up = self.forward(peer.upstream, body)
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


def check_a_rewritten_credential_is_not_taken(server_url: str, operator: Conn, root_name: str, credential: object) -> None:
    """A worker (a child of a root named root_name) whose first heartbeat's
    answer a RewritingProxy rewrote to carry credential: the operator's
    drain reaches it as a drain (the agent did not abort itself, the
    control plane having refused nothing of its own credential), and it
    keeps its own credential, its run without error."""
    root = Agent.register_root(operator, root_name)
    child = root.spawn("worker")
    proxy = RewritingProxy(server_url, credential)
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


class CancelledToolCall:
    """A call of the tool "search" through a gate by a child (named caller)
    of the tree's root, granted tool:search: its tool runs until the call is
    cancelled, with a guard of 20 s against the hang (200 refresh intervals
    of the 0.1 s the gate tests inject), then checks the call. ``heard``
    holds whether the tool heard its cancel, ``result`` what the call
    ended with (None, or the exception it raised)."""

    def __init__(self, tree, gate: ToolGate, caller: str):
        self.gate = gate
        self.child = tree.root.spawn(caller)
        self.grant = tree.root.delegate(tree.root_grant_id, self.child.node_id, ["tool:search"], ttl=600)
        self.running = threading.Event()
        self.heard: list[bool] = []
        self.result: list[BaseException | None] = []
        self.thread = threading.Thread(target=self._call, daemon=True)

    def _tool(self) -> None:
        call = current_call()
        self.running.set()
        # A guard against the hang (200 refresh intervals), not a timing.
        self.heard.append(call.cancelled.wait(20))
        call.check()

    def _call(self) -> None:
        try:
            self.gate.run(self.grant.token, "search", self._tool)
            self.result.append(None)
        except BaseException as e:  # noqa: BLE001 — the test reads it
            self.result.append(e)

    def start(self) -> None:
        """Begins the call, and waits for its tool to run."""
        self.thread.start()
        assert self.running.wait(10), "the tool did not run"

    def cancelled(self, operator: Conn, deaf: Callable[[], str]) -> None:
        """Aborts the caller (the cancel's acknowledgement awaited an hour),
        waits for the call to end (a guard against the hang), and asserts
        that the tool heard its cancel (deaf says what it means if not) and
        the call ended ToolCallCancelled."""
        terminate(operator, self.child.node_id, "abort", ack="3600s")
        self.thread.join(30)
        assert self.heard == [True], deaf()
        assert self.result and isinstance(self.result[0], ToolCallCancelled), f"the call ended with {self.result}, want ToolCallCancelled"
