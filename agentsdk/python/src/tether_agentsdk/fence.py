"""Fence: the tool server's half of lease fencing, as the Go SDK's
``agentsdk.Fence``. A side effect carries the job id and the lease
generation its caller holds (a LeaseWorker Job's ``headers()``), and the
fence refuses one whose generation is lower than the highest it has seen
for that job."""

from __future__ import annotations

import re
import threading
from typing import Callable, Mapping

from . import _wire
from ._connect import NOT_FOUND, ConnectError, Conn

HEADER_JOB_ID = "Tether-Job-Id"
HEADER_LEASE_GENERATION = "Tether-Lease-Generation"
_MAX_UINT64 = (1 << 64) - 1
_GENERATION = re.compile(r"[1-9][0-9]{0,19}")

#: Confirms that generation was issued for job (the job's current one or
#: earlier), or raises (UnissuedGeneration when it was not).
GenerationCheck = Callable[[str, int], None]


class Fenced(Exception):
    """A side effect from a superseded lease generation: its caller no
    longer has authority to act."""


class UnissuedGeneration(Exception):
    """A side effect claiming a generation the coordinator has not issued
    for its job: the header is the caller's word, and a caller that could
    raise the fence to a generation nobody holds would fence the real
    holder out."""


def issued_generations(conn: Conn) -> GenerationCheck:
    """The GenerationCheck that asks the control plane (LeaseService.GetLease,
    which a tool server's token may call): a generation above the lease's,
    and a job it does not know, are UnissuedGeneration."""

    def check(job: str, generation: int) -> None:
        try:
            lease = conn.call("LeaseService", "GetLease", {"jobId": job}).get("lease", {})
        except ConnectError as e:
            if e.code == NOT_FOUND:
                raise UnissuedGeneration(f"fence: job {job!r} has no lease") from None
            raise ConnectError(e.code, f"fence: asking the coordinator for job {job!r}'s generation: {e.message}") from None
        current = _wire.uint64(lease.get("leaseGeneration"))
        if generation > current:
            raise UnissuedGeneration(f"fence: job {job!r} generation {generation} is above the coordinator's, {current}")

    return check


class Fence:
    """Refuses side effects from superseded lease generations. Equal
    generations pass (one holder's calls are not ordered against each
    other). Generations are kept in memory: a tool server that must fence
    across its own restarts stores the highest generation beside the side
    effect and seeds the fence with ``observe``.

    ``check``, when set, confirms a generation above the highest seen before
    the fence raises to it (once per generation, not per call). Without it,
    anyone who can reach the tool server can send a generation nobody holds
    and fence the job's real holder out: a tool server reachable by callers
    it does not trust passes ``issued_generations(its own conn)``.
    """

    def __init__(self, *, check: GenerationCheck | None = None):
        self.check = check
        self._lock = threading.Lock()
        self._highest: dict[str, int] = {}

    def admit(self, job: str, generation: int) -> None:
        """Admits a side effect for job under generation, raising the job's
        highest generation to it; raises Fenced when a newer one was seen,
        UnissuedGeneration when the check refused it (nothing is raised
        then), or the check's error when the coordinator could not be asked."""
        if not isinstance(job, str) or not job or isinstance(generation, bool) or not isinstance(generation, int) \
                or not 0 < generation <= _MAX_UINT64:
            raise ValueError("fence: a side effect needs a job id and a lease generation (a positive integer)")
        with self._lock:
            h = self._highest.get(job, 0)
            if generation < h:
                raise _fenced(job, generation, h)
            if generation == h or self.check is None:
                self._observe(job, generation)
                return
        self.check(job, generation)
        with self._lock:
            h = self._highest.get(job, 0)  # raised meanwhile?
            if generation < h:
                raise _fenced(job, generation, h)
            self._observe(job, generation)

    def admit_headers(self, headers: Mapping[str, str]) -> None:
        """admit() for a request's headers (any mapping; names matched
        without regard to case): both are required, the generation a
        positive decimal integer; a request without them raises ValueError."""
        lowered = {k.lower(): v for k, v in headers.items()}
        job = lowered.get(HEADER_JOB_ID.lower())
        raw = lowered.get(HEADER_LEASE_GENERATION.lower())
        if not isinstance(job, str) or not job or not isinstance(raw, str) or not _GENERATION.fullmatch(raw) or int(raw) > _MAX_UINT64:
            raise ValueError(f"fence: {HEADER_JOB_ID} and {HEADER_LEASE_GENERATION} (a positive integer) are required")
        self.admit(job, int(raw))

    def observe(self, job: str, generation: int) -> None:
        """Raises the job's highest generation without admitting anything."""
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
