"""Fence: the tool server's half of lease fencing, as the Go SDK's
``agentsdk.Fence``. A side effect carries the job id and the lease
generation its caller holds (a LeaseWorker Job's ``headers()``), and the
fence refuses one whose generation is lower than the highest it has seen
for that job; with a check, also one the coordinator did not issue or
says may not act now."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from . import _wire
from ._connect import NOT_FOUND, ConnectError, Conn
from .toolgate import current_call

HEADER_JOB_ID = "Tether-Job-Id"
HEADER_LEASE_GENERATION = "Tether-Lease-Generation"
_MAX_UINT64 = (1 << 64) - 1
_GENERATION = re.compile(r"[1-9][0-9]{0,19}")
#: The longest job id the coordinator accepts, in UTF-8 bytes (the lease
#: record's bound on ids). A fence refuses a longer one, and one that is
#: not UTF-8 or holds a control character, as a job the coordinator never
#: issued, without asking it and without remembering it.
MAX_JOB_ID_BYTES = 256
# A C0 or C1 control character (Go's unicode.IsControl).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _job_id_problem(job: str) -> str:
    """Why job cannot be a job id the coordinator issued, or "" when it can.
    It never quotes job."""
    if not job:
        return "the job id is empty"
    try:
        size = len(job.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        return "a job id that is not UTF-8"
    if size > MAX_JOB_ID_BYTES:
        return f"a job id of {size} bytes (the coordinator issues at most {MAX_JOB_ID_BYTES})"
    if _CONTROL.search(job):
        return "a job id holding a control character"
    return ""


def _valid_generation(generation: object) -> bool:
    return isinstance(generation, int) and not isinstance(generation, bool) and 0 < generation <= _MAX_UINT64


class Fenced(Exception):
    """A side effect from a superseded lease generation: its caller no
    longer has authority to act."""


class UnissuedGeneration(Exception):
    """A side effect claiming a generation the coordinator has not issued
    for its job: the header is the caller's word, and a caller that could
    raise the fence to a generation nobody holds would fence the real
    holder out."""


class NoAuthority(Exception):
    """A side effect under the job's current generation when that
    generation may not act now: it is only offered (not accepted), expired
    or terminal, its holder was asked to cancel or its exit was confirmed,
    or the coordinator recorded an ownership conflict. The holder may believe it holds the
    lease; the coordinator says it does not, and a fenced resource takes
    its word."""


@dataclass(frozen=True)
class Authority:
    """The coordinator's answer about a job's lease, as a fence needs it."""

    #: The job's current generation: every one up to it was issued, every
    #: one below it is superseded.
    generation: int
    #: The current generation may act now: ACTIVE on the coordinator's
    #: clock, no cancel requested, no ownership conflict, its holder's exit
    #: not confirmed.
    active: bool = False
    #: When an active generation's authority ends (seconds since the
    #: epoch), as the coordinator stated it.
    until: float = 0.0
    #: Why the generation may not act, when not active.
    why: str = ""
    #: The refusal is of the call the check named (a ToolGate call that is
    #: neither the holder's nor one of its descendants'), not of the
    #: generation, which may still act for its holder: a fence keeps what it
    #: knows of the generation.
    caller_refused: bool = False


#: Asks the coordinator about job's lease, for a side effect claiming a
#: generation (job, generation); raises UnissuedGeneration for a job it
#: does not know, another error when it could not be asked.
GenerationCheck = Callable[[str, int], Authority]


def issued_generations(conn: Conn) -> GenerationCheck:
    """The GenerationCheck that asks the control plane (LeaseService.GetLease,
    which a tool server's token may call) naming the generation claimed: the
    job's generation and whether it may act now — not when its holder's exit
    was confirmed (the answer's holderExited; the control plane keeps the side
    effect on the holder as activity after its exit). The read is charged to the
    tool server's reads of that job when the answer admits the generation
    named, and to its refusals otherwise: callers claiming generations that
    are not the job's current one, or that may not act, cannot spend the
    reads its holder's side effects need.

    Asked inside a ToolGate call (``current_call()``), it names the gate's
    call: the control plane then reads whose call it is from its own ledger
    and keeps a side effect under an exited holder's generation on the holder
    only when the call is the holder's, so a stranger calling the tool with
    the holder's job and generation is refused without framing the holder;
    and a call that is neither the holder's nor one of its descendants' is
    refused under the holder's generation however alive the holder is
    (notHoldersCall).
    The call must be one the gate began with the tool-server token conn
    carries; another's is refused failed_precondition. Asked elsewhere, it
    names no call (the read is weighed against the holder whoever asked)."""

    def check(job: str, generation: int) -> Authority:
        request = {"jobId": job, "leaseGeneration": str(generation)}
        gated = current_call()
        if gated is not None:
            request["callId"] = gated.call_id
        try:
            resp = conn.call("LeaseService", "GetLease", request)
        except ConnectError as e:
            if e.code == NOT_FOUND:
                raise UnissuedGeneration(f"fence: job {job!r} has no lease") from None
            raise ConnectError(e.code, f"fence: asking the coordinator about job {job!r}'s lease: {e.message}") from None
        lease = resp.get("lease", {})
        current = _wire.uint64(lease.get("leaseGeneration"))
        state = lease.get("state", "LEASE_STATE_UNSPECIFIED")
        if state != "LEASE_STATE_ACTIVE":
            return Authority(current, why="is " + str(state).removeprefix("LEASE_STATE_"))
        if resp.get("notHoldersCall"):  # absent from a server without the field
            return Authority(current, why="is not the holder's: the call is neither the holder's nor one of its descendants'", caller_refused=True)
        if resp.get("holderExited"):  # absent from a server without the field
            return Authority(current, why="is held by an agent whose exit was confirmed")
        if lease.get("cancelRequested"):
            return Authority(current, why="was asked to cancel")
        if lease.get("ownershipConflict"):
            return Authority(current, why="has an unresolved ownership conflict")
        expires = _wire.parse_timestamp(lease.get("expiresAt"))
        if expires is None:
            return Authority(current, why="has no expiry")  # not an answer the coordinator gives
        return Authority(current, active=True, until=expires.timestamp())

    return check


class Fence:
    """Refuses side effects from superseded lease generations. Equal
    generations pass (one holder's calls are not ordered against each
    other). Generations are kept in memory: a tool server that must fence
    across its own restarts stores the highest generation beside the side
    effect and seeds the fence with ``observe``.

    ``check``, when set, is asked about the job before a side effect is
    admitted: the fence then admits only the job's current generation while
    it may act (UnissuedGeneration above it, NoAuthority when it may not
    act), and raises its highest generation to the coordinator's. Without
    it, anyone who can reach the tool server can send a generation nobody
    holds and fence the job's real holder out, and a holder whose job was
    cancelled, expired or ended keeps writing until a later generation is
    seen: a tool server reachable by callers it does not trust passes
    ``issued_generations(its own conn)``. Inside a ToolGate call
    (``current_call()``) a superseded generation is asked about too, and
    refused all the same, so the control plane keeps a former holder's side
    effect after its exit on it; outside one it is refused without asking.

    ``max_stale`` (seconds, default 0: ask for every side effect) is how
    long an answer that a generation may act admits its side effects
    without asking, from when the fence asked, and never past the expiry
    the coordinator stated (read on ``clock``): the coordinator's cancel,
    expiry or resolution takes effect at the fence within it. Answers that
    refuse are never kept.
    """

    def __init__(self, *, check: GenerationCheck | None = None, max_stale: float = 0.0,
                 clock: Callable[[], float] = time.time):
        if not max_stale >= 0:
            raise ValueError("fence: max_stale must not be negative")
        self.check = check
        self.max_stale = max_stale
        self._clock = clock
        self._lock = threading.Lock()
        self._highest: dict[str, int] = {}
        # job -> (generation an answer said may act, until, the node of the
        # gate call it was given for: "" outside a gate)
        self._active: dict[str, tuple[int, float, str]] = {}

    def admit(self, job: str, generation: int) -> None:
        """Admits a side effect for job under generation, raising the job's
        highest generation to it; raises Fenced when a newer one was seen,
        and with a check UnissuedGeneration or NoAuthority when the
        coordinator refused it (nothing is admitted then), or the check's
        error when it could not be asked."""
        if not isinstance(job, str) or not job or not _valid_generation(generation):
            raise ValueError("fence: a side effect needs a job id and a lease generation (a positive integer)")
        problem = _job_id_problem(job)
        if problem:
            # Neither asked about nor remembered: such a job has no lease,
            # and a caller naming it must not spend the fence's memory, nor
            # a request to the coordinator answered as if it were down.
            raise UnissuedGeneration(f"fence: {problem}")
        asked_at = self._clock() if self.max_stale > 0 else 0.0
        gated = current_call()
        caller = gated.node_id if gated is not None else ""
        with self._lock:
            h = self._highest.get(job, 0)
            superseded = generation < h
            if superseded and (self.check is None or gated is None):
                raise _fenced(job, generation, h)
            cached = self._active.get(job)
            if not superseded and (self.check is None or self.max_stale > 0 and cached is not None and cached[0] == generation and cached[2] == caller and asked_at < cached[1]):
                self._observe(job, generation)
                return
        if superseded:
            # Refused all the same, but asked about inside a ToolGate
            # call: the read names the call, and the control plane keeps a
            # side effect under a superseded generation on the call's node
            # when it held the job (a former holder writing after its
            # exit). An ungated fence does not ask: its read names no
            # caller, and anyone naming the job and an old generation
            # would frame its former holders.
            try:
                self.observe(job, self.check(job, generation).generation)
            except Exception:  # the fence's own knowledge refuses it
                pass
            raise _fenced(job, generation, h)
        a = self.check(job, generation)
        with self._lock:
            self._observe(job, a.generation)  # issued: older generations are superseded
            h = self._highest.get(job, 0)
            if generation < h:
                raise _fenced(job, generation, h)
            if generation > a.generation:
                raise UnissuedGeneration(f"fence: job {job!r} generation {generation} is above the coordinator's, {a.generation}")
            cached = self._active.get(job)
            if not a.active:
                if cached is not None and cached[0] == generation and not a.caller_refused:
                    del self._active[job]
                raise NoAuthority(f"fence: job {job!r} generation {generation} {a.why or 'may not act'}")
            if self.max_stale > 0:
                until = min(asked_at + self.max_stale, a.until)
                if cached is None or cached[0] != generation or cached[2] != caller or until > cached[1]:
                    self._active[job] = (generation, until, caller)

    def admit_headers(self, headers: Mapping[str, str]) -> None:
        """admit() for a request's headers (any mapping, an
        ``email.message.Message`` such as http.server's included; names
        matched without regard to case): both are required, once each, the
        generation a positive decimal integer; a request without them, or
        whose job id the coordinator could not have issued
        (MAX_JOB_ID_BYTES), raises ValueError before anything is asked."""
        values: dict[str, list] = {HEADER_JOB_ID.lower(): [], HEADER_LEASE_GENERATION.lower(): []}
        for name, value in headers.items():
            if isinstance(name, str) and name.lower() in values:
                values[name.lower()].append(value)
        jobs, raws = values[HEADER_JOB_ID.lower()], values[HEADER_LEASE_GENERATION.lower()]
        job = jobs[0] if len(jobs) == 1 else None
        raw = raws[0] if len(raws) == 1 else None
        if not isinstance(job, str) or not job or not isinstance(raw, str) or not _GENERATION.fullmatch(raw) or int(raw) > _MAX_UINT64:
            raise ValueError(f"fence: {HEADER_JOB_ID} and {HEADER_LEASE_GENERATION} (a positive integer) are required, once each")
        problem = _job_id_problem(job)
        if problem:
            raise ValueError(f"fence: {HEADER_JOB_ID} is not a job the coordinator issues: {problem}")
        self.admit(job, int(raw))

    def observe(self, job: str, generation: int) -> None:
        """Raises the job's highest generation without admitting anything
        (seeding from storage). Generation 0 raises nothing and remembers
        nothing; one that is not an int in [0, 2**64) raises ValueError."""
        if type(generation) is int and generation == 0:
            return
        if not _valid_generation(generation):
            raise ValueError("fence: a generation is an integer in [0, 2**64)")
        with self._lock:
            self._observe(job, generation)

    def highest(self, job: str) -> int:
        """The highest generation seen for job (0 if none)."""
        with self._lock:
            return self._highest.get(job, 0)

    def _observe(self, job: str, generation: int) -> None:
        if generation > self._highest.get(job, 0):
            self._highest[job] = generation


def _fenced(job: str, generation: int, highest: int) -> Fenced:
    return Fenced(f"fenced: job {job!r} generation {generation} is older than generation {highest}")
