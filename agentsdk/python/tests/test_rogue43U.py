"""The forty-third hostile pass on the Python SDK (letter U): parity with
the Go SDK's fixes of the pass (rogue43l tests).

The agent being stopped holds a job under a LeaseWorker, and its path to
the control plane (a proxy's, a peer's) withholds its lease traffic while
its node is aborted: the stop's cancel request never reaches the job, and
the stop ends all the same (the operator confirms the exit, the record is
written, the node's credential refused). Once the path is honest again
every renewal is refused unauthenticated, and the renew thread logged each
and went on: the job's work ran for its lease's whole window (here ten
minutes) after its stop, as the Agent would have aborted at the first such
refusal. The renew loop now ends the job on a dead credential
(unauthenticated, permission_denied) as on a confirmed exit
(failed_precondition).

A hostile element on a tool server's path holds the gate's WatchCancels
stream open and silent: the gate waited on it for good, deaf to every
cancel order even once the path was honest again. A gate with a call in
flight now opens its stream anew every ``cancel_watch_refresh``.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse

from conftest import NO_RETRY
from helpers import LOOP_RENEW_EVERY, CancelledToolCall, LoopbackPeer, QuietHandler, WatchCancelsPath, relay_end, terminate, wait_for
from tether_agentsdk import Conn, LeaseWorker, ToolGate
from tether_agentsdk.leaseworker import JOB_ENDED


class WithholdingPath(LoopbackPeer):
    """A relay on loopback in front of the real server (the path between a
    worker and its control plane). While ``cut`` is set it answers every
    request 503 (a path that lets nothing through) and relays nothing;
    otherwise it relays each as it came. It counts the renewals the control
    plane refused unauthenticated (401: a dead credential)."""

    def __init__(self, upstream: str):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.cut = threading.Event()
        self.lock = threading.Lock()
        self.refused = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                if peer.cut.is_set():
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                up = self.forward(peer.upstream, body)
                if self.path.endswith("/Renew"):
                    resp = up.getresponse()
                    data = resp.read()
                    up.close()
                    if resp.status == 401:
                        with peer.lock:
                            peer.refused += 1
                    self.answer_whole(resp, data)
                    return
                self.relay_answer(up)

        self.serve(Handler)

    def refusals(self) -> int:
        with self.lock:
            return self.refused


def test_rogue43U_lease_worker_stops_a_job_whose_credential_is_dead(server, tree, tmp_path):
    child = tree.root.spawn("rogue43u-worker")
    job_id = "job-43u-" + child.node_id
    path = WithholdingPath(server.url)
    w = LeaseWorker(Conn(path.url, child.credential, retry=NO_RETRY), str(tmp_path), renew_every=LOOP_RENEW_EVERY)
    try:
        offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "600s"})["lease"]
        job = w.accept(offered)
        path.cut.set()  # the path withholds the worker's lease traffic
        term = terminate(tree.operator, child.node_id, "abort", ack="1s", confirm="1s")
        tree.operator.call("AgentService", "ConfirmExit", {"nodeId": child.node_id, "reason": "rogue43u"})
        wait_for("the abort to terminate",
                 lambda: tree.operator.call("SupervisorService", "GetTermination", {"terminationId": term["terminationId"]})
                 ["termination"]["state"] == "TERMINATION_STATE_TERMINATED", timeout=30)
        assert not job.stopped.is_set(), f"the job ended ({job.cause}) while its path withheld everything: the test proves nothing"
        path.cut.clear()  # honest again
        enough = 5
        wait_for("the job to end or its renewals to be refused", lambda: job.stopped.is_set() or path.refusals() >= enough, timeout=60)
        assert job.stopped.is_set(), \
            f"the job still works after its node's stop: {path.refusals()} renewals refused unauthenticated"
        assert job.cause == JOB_ENDED, job.cause
        assert job.refusal is not None and job.refusal.code == "unauthenticated", job.refusal
        assert path.refusals() == 1, f"{path.refusals()} renewals refused before the job ended, want 1"
    finally:
        w.close()
        path.close()


class StallingPath(WatchCancelsPath):
    """A relay on loopback in front of the real server (a tool server's path
    to its control plane) that holds the gate's first WatchCancels stream
    open and relays nothing of it (the stream reaches the control plane;
    its answer's headers reach the gate, its orders never do), and relays
    every other request, and every later stream, as it came. It counts the
    streams the gate opened."""

    def watch(self, handler: QuietHandler, up: http.client.HTTPConnection, n: int) -> None:
        if n != 1:
            super().watch(handler, up, n)
            return
        handler.relay_head(up.getresponse())
        handler.wfile.flush()
        # Silent until the gate leaves the stream (or the test ends):
        # then the control plane's end of it is shut too.
        relay_end(handler.connection, up.sock)
        up.close()


def test_rogue43U_a_silent_cancel_stream_does_not_deafen_the_gate(server, tree):
    """A hostile element on a tool server's path holds the gate's
    WatchCancels stream open and silent. The stream carries cancel orders
    only, so its silence is what an honest control plane with nothing to
    cancel sends too: the gate waited on it for good, deaf to every cancel
    order even once the path was honest again, and the agent being stopped
    had its tool run on past the cancel its abort ordered. Now a gate with
    a call in flight opens its stream anew every ``cancel_watch_refresh``
    (the control plane sends every pending order again on a new stream),
    and the tool's call is cancelled."""
    name = "rogue43u-gate"
    token = server.tool_server(name).token
    path = StallingPath(server.url)
    gate = ToolGate(Conn(path.url, token, retry=NO_RETRY), name)
    gate.cancel_watch_refresh = 0.1
    call = CancelledToolCall(tree, gate, "rogue43u-caller")
    try:
        gate.start()
        assert gate.ready.wait(10), "the gate's stream did not open"
        call.start()
        call.cancelled(tree.operator, lambda: f"the gate is deaf: its tool ran on 20 s (200 refresh intervals) after its abort was ordered; "
                                              f"{path.streams()} WatchCancels stream(s) opened, the stalled one still waited on")
        assert path.streams() >= 2, f"the order heard on {path.streams()} stream(s): the stalled one relayed it"
    finally:
        gate.close()
        path.close()
