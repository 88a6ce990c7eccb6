"""The eighteenth hostile pass on the Python SDK: the control plane as a
peer that misbehaves (a loopback HTTP server speaking the Connect protocol
where the control plane would be). A tool gate kept every cancel order for
a call it had not registered, for ever: orders for calls it never began (a
previous process's left in the ledger, replayed on each reconnect, or a
hostile peer's made-up ids) grew its memory without bound. And a stream
answered the HTTP/1.0 way (the connection closes at its end: a proxy's
answer) could not be closed from another thread: the agent's, gate's or
verifier's close() waited its ten seconds and left the thread reading."""

from __future__ import annotations

import json
import queue
import struct
import threading

from helpers import LoopbackPeer, QuietHandler, wait_for
from tether_agentsdk import ConnectError, Conn, LeaseWorker, ToolCallCancelled, ToolGate


def _envelope(flags: int, msg: dict) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


class OrdersPeer(LoopbackPeer):
    """Answers a gate's WatchCancels: the first stream is a flood of orders
    for made-up call ids, then its end; the second stays open and carries
    what the test puts on ``orders``. BeginCall waits for ``begin_answer``;
    CancelAck answers at once."""

    def __init__(self, flood: int):
        self.flood = flood
        self.watches = 0
        self.second_watch = threading.Event()
        self.begun = threading.Event()
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
                    with peer.lock:
                        peer.watches += 1
                        n = peer.watches
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json")
                    self.end_headers()
                    if n == 1:
                        self.wfile.write(b"".join(_envelope(0, {"callId": f"made-up-{i}", "reason": "flood"}) for i in range(peer.flood)))
                        self.wfile.write(_envelope(2, {}))
                        return
                    peer.second_watch.set()
                    while not peer.closing.is_set():
                        try:
                            order = peer.orders.get(timeout=0.1)
                        except queue.Empty:
                            continue
                        self.wfile.write(_envelope(0, order))
                        self.wfile.flush()
                    return
                if method == "BeginCall":
                    peer.begun.set()
                    answer = peer.begin_answer.get()
                elif method == "CancelAck":
                    answer = {}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.answer_json(answer)

        self.serve(Handler)

    def close(self) -> None:
        self.begin_answer.put({})
        super().close()


def test_a_gate_keeps_no_cancel_order_for_a_call_it_never_began():
    peer = OrdersPeer(flood=5000)
    gate = ToolGate(Conn(peer.url, "rogue18-tool-token"), "py-rogue18-gate").start()
    try:
        # The gate has read the whole flood once it reconnected.
        assert peer.second_watch.wait(30), "the gate never reconnected after the flood"
        assert gate.held_orders == 0, f"the gate keeps {gate.held_orders} orders for calls it never began"

        # A real early order: it comes while this gate's begin waits for
        # its answer, and the answer names its call.
        # Its block does not run (rogue43O): the cancel was ordered first.
        outcome: list[BaseException] = []
        entered: list[bool] = []

        def run_call():
            try:
                with gate.call("a-capability-token", "shell") as call:
                    entered.append(True)
                    call.check()
            except BaseException as e:  # noqa: BLE001 — the test reads it
                outcome.append(e)

        t = threading.Thread(target=run_call, daemon=True)
        t.start()
        assert peer.begun.wait(30)
        peer.orders.put({"callId": "call-early", "reason": "termination t1 cancelled the call"})
        wait_for("the early order held", lambda: gate.held_orders == 1)
        peer.begin_answer.put({"call": {"callId": "call-early", "tool": "shell"}})
        t.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], ToolCallCancelled), outcome
        assert entered == [], "the block ran on a call whose cancel was ordered before it began"
        assert gate.held_orders == 0
    finally:
        gate.close()
        peer.close()


class HoldingPeer(LoopbackPeer):
    """Answers every stream the HTTP/1.0 way (no length: the connection's
    close ends it) and then says nothing until the test ends."""

    def __init__(self):
        super().__init__()
        self.opened = threading.Event()
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.end_headers()
                self.wfile.flush()
                peer.opened.set()
                peer.closing.wait(120)

        self.serve(Handler)



def test_a_stream_answered_the_http10_way_closes_from_another_thread():
    peer = HoldingPeer()
    try:
        stream = Conn(peer.url, "rogue18-token", timeout=600).stream("ToolService", "WatchCancels", {"gateId": "g"})
        assert peer.opened.wait(30)
        ended = threading.Event()

        def read():
            for _ in stream:
                pass
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        stream.close()
        # A bound, not a timing: the reader wakes at once, or only when the
        # peer lets go (at the test's end).
        assert ended.wait(20), "close() did not wake the reader of a stream whose connection closes at its end"
    finally:
        peer.close()


class HungRenewPeer(LoopbackPeer):
    """A coordinator that answers the ACK and accepts every renewal without
    ever answering it (until the test ends)."""

    def __init__(self):
        super().__init__()
        self.renewals = 0
        self.lock = threading.Lock()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                if method == "Renew":
                    with peer.lock:
                        peer.renewals += 1
                    peer.closing.wait(120)
                    return
                self.answer_json({
                    "lease": {"jobId": "py-rogue18-hung", "leaseId": "l1", "leaseGeneration": "1",
                              "state": "LEASE_STATE_ACTIVE", "leaseDuration": "300s"},
                    "decision": {"outcome": "OUTCOME_ACCEPTED"},
                })

        self.serve(Handler)

    def count(self) -> int:
        with self.lock:
            return self.renewals



def test_a_renewal_nobody_answers_is_given_up_after_the_renew_interval(tmp_path):
    # The Go and TypeScript workers give each renewal the renew interval to
    # be answered; the Python one waited the connection's timeout (here an
    # hour), renewing nothing meanwhile: a job deaf to its cancel and its
    # loss for as long as a hung coordinator held one request.
    peer = HungRenewPeer()
    w = LeaseWorker(Conn(peer.url, "rogue18-agent-token", timeout=3600), str(tmp_path), renew_every=0.05)
    job = w.accept({"jobId": "py-rogue18-hung", "leaseId": "l1", "leaseGeneration": "1", "state": "LEASE_STATE_OFFERED"})
    try:
        wait_for("a renewal after one nobody answered", lambda: peer.count() >= 3)
    finally:
        job.stop()
        w.close()
        peer.close()


class TricklingPeer(LoopbackPeer):
    """Answers every call with a body it sends one byte at a time, each
    soon enough to beat any socket timeout, for as long as the test runs."""

    def __init__(self):
        super().__init__()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.read_body()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(1 << 20))
                self.end_headers()
                try:
                    while not peer.closing.wait(0.05):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:
                    pass  # the caller gave up

        self.serve(Handler)



def test_an_answer_that_never_ends_is_given_up_at_the_call_s_timeout():
    # The timeout bounded each read, not the call: a peer that trickles an
    # answer held the call (a renewal, a heartbeat, a gate's report) for as
    # long as it liked, whatever timeout the caller gave.
    peer = TricklingPeer()
    outcome: list[BaseException] = []

    def call():
        try:
            Conn(peer.url, "rogue18-token").call("LeaseService", "Renew", {}, timeout=0.5)
        except BaseException as e:  # noqa: BLE001 — the test reads it
            outcome.append(e)

    t = threading.Thread(target=call, daemon=True)
    try:
        t.start()
        # A bound, not a timing: the call ends at its timeout, or only when
        # the peer stops (at the test's end).
        t.join(20)
        assert not t.is_alive(), "the call still reads an answer that never ends"
        assert len(outcome) == 1 and isinstance(outcome[0], ConnectError) and outcome[0].code == "deadline_exceeded", outcome
        assert "rogue18-token" not in str(outcome[0])
    finally:
        peer.close()


def test_a_begin_answered_without_its_call_is_refused_in_the_sdk_s_words():
    # A proxy's, or a hostile peer's answer: the gate raised a bare
    # KeyError ('call'); the Go and TypeScript gates now refuse it as an
    # internal error, the tool not run.
    peer = OrdersPeer(flood=0)
    gate = ToolGate(Conn(peer.url, "rogue18-tool-token"), "py-rogue18-gate-empty")
    ran = []
    try:
        peer.begin_answer.put({})
        try:
            with gate.call("a-capability-token", "shell"):
                ran.append(True)
        except ConnectError as e:
            assert e.code == "internal" and "without a call" in e.message, e
        else:
            raise AssertionError("a begin answered without its call went on")
        assert not ran
        assert gate.held_orders == 0
    finally:
        gate.close()
        peer.close()
