"""The forty-sixth hostile pass on the Python SDK's LeaseWorker (letter C),
the Go and TypeScript workers' fix of the pass
(TestRogue46CAnOfferWithoutADurationDoesNotTakeAForgedWindow,
rogue46C.test.ts) in Python, in front of the real server.

A job accepted from an offer that names no lease duration (one its caller
built by hand from the ids it was handed: job, lease, generation) took its
window from whatever duration each accepted answer named. The forty-fourth
pass bounded the answers' duration by the offer's and left such an offer
to the answers (design §11): a rogue path to the control plane answers the
job's first renewal with the real accepted answer and a day's duration in
its lease, then withholds everything. The job's bound moved a day on: cut
off from its coordinator, deaf to a cancel request, it worked on past its
30-second lease's expiry for the day. The generation's duration is now
fixed by the ACK's answer when the offer names none, as by the offer when
it does.

And an accepted answer naming no duration at all (the offer naming none
either) set no bound: the job then never stopped on its own clock, cut off
for ever, where the Go and TypeScript jobs end at once (nothing proves a
window). It now stops as they do.
"""

from __future__ import annotations

import json
import threading
import urllib.parse

from conftest import NO_RETRY
from helpers import LoopbackPeer, QuietHandler, wait_for
from tether_agentsdk import Conn, LeaseWorker
from tether_agentsdk.leaseworker import LEASE_LOST


class ForgingPath(LoopbackPeer):
    """A relay on loopback in front of the real server. It answers the
    first ``method`` (Ack or Renew) of job ``own`` with the real answer,
    its lease's duration replaced by ``forged`` (removed when None), and
    every request after that one 503: the forged answer is the last the
    job hears."""

    def __init__(self, upstream: str, own: str, method: str, forged: str | None):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.own = own
        self.method = method
        self.forged = forged
        self.did_forge = threading.Event()
        self.did_withhold = threading.Event()
        self.lock = threading.Lock()
        self.withheld = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                if peer.did_forge.is_set():
                    with peer.lock:
                        peer.withheld += 1
                    peer.did_withhold.set()
                    self.answer_json({"code": "unavailable", "message": "the path withholds the worker's lease traffic (rogue46c)"}, 503)
                    return
                up = self.forward(peer.upstream, body)
                if not self.path.endswith(".LeaseService/" + peer.method):
                    self.relay_answer(up)
                    return
                resp = up.getresponse()
                data = resp.read()
                up.close()
                if resp.status == 200 and json.loads(body).get("jobId") == peer.own:
                    real = json.loads(data)
                    lease = dict(real.get("lease") or {})
                    lease.pop("leaseDuration", None)
                    if peer.forged is not None:
                        lease["leaseDuration"] = peer.forged
                    data = json.dumps({**real, "lease": lease}).encode()
                    peer.did_forge.set()
                self.answer_whole(resp, data)

        self.serve(Handler)


def run_cut_off_after(server, tree, tmp_path, name: str, method: str, forged: str | None) -> None:
    child = tree.root.spawn("rogue46c-" + name)
    job_id = f"job-46c-{name}-{child.node_id}"
    path = ForgingPath(server.url, job_id, method, forged)
    conn = Conn(path.url, child.credential, retry=NO_RETRY)
    offered = tree.operator.call("LeaseService", "Offer", {
        "jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s"})["lease"]
    # The worker is handed the ids, not the lease: its caller builds the
    # offer it accepts, with no duration in it.
    hand_built = {"jobId": offered["jobId"], "leaseId": offered["leaseId"], "leaseGeneration": offered["leaseGeneration"]}
    now = [1000.0]
    worker = LeaseWorker(conn, str(tmp_path), renew_every=1.0, clock=lambda: now[0])
    try:
        job = worker.accept(hand_built)
        # The forged answer (the ACK's, or the renew thread's first
        # renewal's), then the thread's next request withheld: the thread
        # acted on the forged answer before it sent that one. The worker's
        # clock has not moved since the ACK. (Guards, not timings.)
        assert path.did_forge.wait(20), f"no forged answer (the job stopped: {job.cause})"
        wait_for("the job's next request after the forged answer (or its stop)",
                 lambda: path.did_withhold.is_set() or job.stopped.is_set())
        assert job.lease.get("renewSequence", "0") == ("1" if method == "Renew" else "0") and job.lease.get("leaseDuration") == forged, \
            f"the forged answer never reached the job (its lease {job.lease}): the test proves nothing"
        # Past the 30-second lease on the worker's clock, with no answer
        # since the forged one: nothing the coordinator accepted covers it.
        now[0] += 31
        # A guard (ten renew ticks), not a timing.
        stopped = job.stopped.wait(10)
        with path.lock:
            withheld = path.withheld
        assert stopped, f"the job works on 31 s after its last accepted renewal of a 30 s lease ({withheld} request(s) withheld)"
        assert job.cause == LEASE_LOST and job.unconfirmed, f"the job stopped with {job.cause} (unconfirmed {job.unconfirmed}), want {LEASE_LOST}"
    finally:
        worker.close()
        path.close()


def test_rogue46c_an_offer_without_a_duration_does_not_take_a_forged_window(server, tree, tmp_path):
    """A day's duration in the first renewal's answer, then nothing: the
    job stops at its 30 s lease on the worker's clock."""
    run_cut_off_after(server, tree, tmp_path, "day", "Renew", "86400s")


def test_rogue46c_an_ack_answer_naming_no_duration_proves_no_window(server, tree, tmp_path):
    """No duration in the ACK's answer (nor in the offer), then nothing:
    the job had no bound at all and worked on, cut off, for ever (the Go
    and TypeScript jobs end at once: nothing proves a window). It stops."""
    run_cut_off_after(server, tree, tmp_path, "none", "Ack", None)
