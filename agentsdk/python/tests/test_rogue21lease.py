"""The twenty-first hostile pass on the Python SDK's LeaseWorker, as the Go
and TypeScript SDKs' (rogue21 tests there too): a framework author's
``close()`` closed the spool and nothing else, so every job renewed on, for
as long as the process lived, and could still report its result."""

from __future__ import annotations

import threading

import pytest

from helpers import LoopbackPeer, QuietHandler
from tether_agentsdk import Conn, LeaseWorker, WorkerClosed
from tether_agentsdk.leaseworker import JOB_ENDED, SUCCESS

_LEASE = {"jobId": "py-rogue21-close", "leaseId": "l1", "leaseGeneration": "1", "state": "LEASE_STATE_ACTIVE", "leaseDuration": "300s"}


class LeasePeer(LoopbackPeer):
    """Answers every lease message, accepted, and counts them by method."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.renewed = threading.Event()
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                method = self.path.rsplit("/", 1)[-1]
                with peer.lock:
                    peer.seen[method] = peer.seen.get(method, 0) + 1
                event = {"Ack": "AUDIT_EVENT_ACKED", "Renew": "AUDIT_EVENT_RENEWED"}.get(method, "")
                if method == "Renew":
                    peer.renewed.set()
                self.answer_json({"lease": _LEASE, "decision": {"outcome": "OUTCOME_ACCEPTED", "auditEvent": event}})

        self.serve(Handler)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.seen)


def test_close_ends_every_job_and_sends_nothing_after(tmp_path):
    peer = LeasePeer()
    w = LeaseWorker(Conn(peer.url, "rogue21-agent-token"), str(tmp_path), renew_every=0.005)
    try:
        job = w.accept({**_LEASE, "state": "LEASE_STATE_OFFERED"})
        assert peer.renewed.wait(30), "the job never renewed"
        w.close()
        assert job.stopped.is_set(), "a job of a closed worker goes on"
        assert job.cause == JOB_ENDED, job.cause
        assert job.done.is_set(), "close() returned while the job's renew thread still ran"
        before = peer.counts()
        with pytest.raises(WorkerClosed):
            job.progress("after close")
        with pytest.raises(WorkerClosed):
            job.complete(SUCCESS, "after close")
        with pytest.raises(WorkerClosed):
            job.renew()
        with pytest.raises(WorkerClosed):
            w.accept({**_LEASE, "jobId": "py-rogue21-close-2", "state": "LEASE_STATE_OFFERED"})
        assert peer.counts() == before, "a closed worker reached the coordinator"
        assert "Progress" not in before and "Complete" not in before
        w.close()  # twice is harmless
    finally:
        w.close()
        peer.close()
