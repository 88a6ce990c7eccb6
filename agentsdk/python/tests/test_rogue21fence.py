"""The twenty-first hostile pass on the Python SDK's Fence, as the Go and
TypeScript SDKs' (rogue21 tests there too): a rogue caller of a fenced tool
naming a job id the coordinator never issues had the fence ask the
coordinator (its refusal raised as if the coordinator were down), one
naming its generation twice had the last one read (the Go fence read the
first, the TypeScript one refuses it), and Fence.observe took a 65-bit or a
fractional generation."""

from __future__ import annotations

import email.message

import pytest

from helpers import LoopbackPeer, QuietHandler
from tether_agentsdk import Conn, Fence, UnissuedGeneration, issued_generations
from tether_agentsdk.fence import MAX_JOB_ID_BYTES

class InvalidIdPeer(LoopbackPeer):
    """Answers GetLease as the real control plane answers a job id it never
    issues (invalid_argument), and counts the asks."""

    def __init__(self):
        super().__init__()
        self.asked = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                self.read_body()
                peer.asked += 1
                self.answer_json({"code": "invalid_argument", "message": "job_id is too long"}, 400)

        self.serve(Handler)


def test_a_fence_refuses_a_job_id_no_coordinator_issues_without_asking():
    peer = InvalidIdPeer()
    try:
        fence = Fence(check=issued_generations(Conn(peer.url, "rogue21-tool-token")))
        long = "j" * (MAX_JOB_ID_BYTES + 1)
        for job in (long, "py-rogue21-\x01", "py-rogue21-\x85", "py-rogue21-\udcff"):
            with pytest.raises(ValueError):
                fence.admit_headers({"Tether-Job-Id": job, "Tether-Lease-Generation": "1"})
            with pytest.raises(UnissuedGeneration):
                fence.admit(job, 1)
            assert fence.highest(job) == 0
        # Named twice, as http.server's headers (an email.message.Message)
        # carry a repeated one, or in two spellings of one name.
        generation_twice = email.message.Message()
        generation_twice["Tether-Job-Id"] = "py-rogue21-j"
        generation_twice["Tether-Lease-Generation"] = "1"
        generation_twice["Tether-Lease-Generation"] = "7"
        job_twice = email.message.Message()
        job_twice["Tether-Job-Id"] = "py-rogue21-j"
        job_twice["Tether-Job-Id"] = "py-rogue21-k"
        job_twice["Tether-Lease-Generation"] = "1"
        spelled_twice = {"Tether-Job-Id": "py-rogue21-j", "tether-job-id": "py-rogue21-k", "Tether-Lease-Generation": "1"}
        for headers in (generation_twice, job_twice, spelled_twice):
            with pytest.raises(ValueError):
                fence.admit_headers(headers)
        assert peer.asked == 0, "the fence asked the coordinator about requests it could refuse on their face"
    finally:
        peer.close()


def test_observe_takes_only_a_generation_a_coordinator_could_issue():
    fence = Fence()
    fence.observe("py-rogue21-seed", 0)  # nothing to raise
    for bad in (-1, 1 << 64, 1.5, True, "3"):
        with pytest.raises(ValueError):
            fence.observe("py-rogue21-seed", bad)
    assert fence.highest("py-rogue21-seed") == 0
    fence.observe("py-rogue21-seed", (1 << 64) - 1)
    assert fence.highest("py-rogue21-seed") == (1 << 64) - 1
