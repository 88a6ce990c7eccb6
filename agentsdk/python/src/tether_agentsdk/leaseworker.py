"""LeaseWorker: work under fenced job leases (the job-lease protocol)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from . import _wire
from ._connect import (
    FAILED_PRECONDITION, INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, PERMISSION_DENIED, UNAUTHENTICATED,
    UNIMPLEMENTED, ConnectError, Conn,
)

log = logging.getLogger("tether_agentsdk")

SUCCESS = "TERMINAL_RESULT_SUCCESS"
FAILED = "TERMINAL_RESULT_FAILED"
CANCELLED = "TERMINAL_RESULT_CANCELLED"

# Why a job must stop (Job.cause).
LEASE_CANCELLED = "cancelled"  # the coordinator requested cancellation
# The generation no longer has authority (expired, superseded, terminal), or
# no renewal the coordinator accepted covers the worker's clock any more
# (the last accepted ACK's or renewal's send time plus the lease duration
# passed: a partition; Job.unconfirmed is then set), or an answer named
# another job, or another lease of this one (not this job's answer: nothing
# in it is taken, and the job's own never came; Job.detail names the ids,
# clipped), as the Go worker's ErrLeaseLost and the TypeScript worker's
# "lost" say.
LEASE_LOST = "lost"
JOB_ENDED = "ended"  # the worker completed or stopped the job
# The coordinator recorded an ownership conflict on the generation (a second
# claimant): execution halts until the coordinator resolves it, as the Go
# worker's OwnershipConflictError and the TypeScript worker's "lost" say.
OWNERSHIP_CONFLICT = "ownership_conflict"

# The RPC for each spooled message kind.
_METHODS = {"ack": "Ack", "renew": "Renew", "progress": "Progress", "cancelAck": "CancelAck", "complete": "Complete"}


class Spooled(Exception):
    """The control plane could not be reached: the message is in the spool,
    synced to disk, and will be replayed with its sequence and sent_at."""


class WorkerClosed(Exception):
    """A closed LeaseWorker sends nothing: its accept and its jobs' renew,
    progress and complete raise this (the Go SDK's ErrWorkerClosed, the
    TypeScript SDK's WorkerClosed)."""

    def __init__(self) -> None:
        super().__init__("the lease worker is closed")


# How long close() waits for its jobs' renew threads to end, in all: one
# whose renewal is in flight ends when it is answered or at its interval,
# one running on_cancel when that returns.
_CLOSE_WAIT = 10.0


class AckRefused(Exception):
    def __init__(self, job_id: str, decision: dict):
        super().__init__(f"ack of job {job_id!r} refused: {decision.get('auditEvent', '')} {decision.get('reason', '')}".strip())
        self.decision = decision


def _retryable(err: ConnectError) -> bool:
    """'Not judged, try later' rather than 'judged' or 'never judgeable'."""
    return err.code not in (INVALID_ARGUMENT, PERMISSION_DENIED, NOT_FOUND, UNIMPLEMENTED, FAILED_PRECONDITION, OUT_OF_RANGE)


def _now() -> str:
    return _wire.timestamp(datetime.now(timezone.utc))


class _Spool:
    """An append-only JSON-lines log of undelivered lease messages: one line
    per message ({"id": n, "kind": k, "request": {...}}) and one per
    delivery ({"done": n}), each fsynced before the call returns. A torn
    last line (a crash mid-append) is ignored; the file is truncated when
    nothing is pending."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self.pending: list[tuple[int, str, dict]] = []
        self._next = 1
        if os.path.exists(path):
            with open(path, "rb") as f:
                for raw in f:
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        continue
                    if not isinstance(line, dict):
                        continue
                    if line.get("done"):
                        self.pending = [p for p in self.pending if p[0] != line["done"]]
                    elif line.get("id") and line.get("kind") in _METHODS and isinstance(line.get("request"), dict):
                        self.pending.append((line["id"], line["kind"], line["request"]))
                        self._next = max(self._next, line["id"] + 1)
        self._f = open(path, "ab")
        if not self.pending:
            self._truncate()

    def _write(self, line: dict) -> None:
        self._f.write(json.dumps(line).encode() + b"\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def _truncate(self) -> None:
        self._f.truncate(0)
        self._f.flush()
        os.fsync(self._f.fileno())

    def append(self, kind: str, request: dict) -> None:
        with self._lock:
            n = self._next
            self._write({"id": n, "kind": kind, "request": request})
            self._next += 1
            self.pending.append((n, kind, request))

    def first(self) -> tuple[int, str, dict] | None:
        with self._lock:
            return self.pending[0] if self.pending else None

    def done(self, n: int) -> None:
        with self._lock:
            if self.pending and self.pending[0][0] == n:
                self.pending.pop(0)
            if not self.pending:
                self._truncate()
            else:
                self._write({"done": n})

    def close(self) -> None:
        self._f.close()


class LeaseWorker:
    """Works under fenced job leases for one agent: ACKs offers, keeps each
    job's lease renewed until the coordinator says it ended, reports
    progress and terminal results, turns a cancel request into the job's
    ``cancelled`` event plus a callback and an acknowledgement, and keeps
    what it could not deliver in an fsynced spool replayed in order once the
    control plane answers again. Expiry is only ever learnt from the
    coordinator; the worker's clock schedules renewals and bounds what a job
    can prove: an accepted ACK or renewal covers its send time plus the
    lease duration (the coordinator counts from its receipt, never
    earlier), and once ``clock`` passes the last such bound without another
    (a partition) the job stops (LEASE_LOST, ``unconfirmed`` set), at or
    before the coordinator's expiry. It never extends authority; progress
    moves no bound.

    ``conn`` is the agent's connection: its credential is the holder
    identity the coordinator binds every message to. One LeaseWorker per
    ``spool_dir`` at a time. ``clock`` (seconds, default time.monotonic,
    on which a timer stops a job at its bound) is for tests; an injected
    one is checked at each renew tick.
    """

    def __init__(self, conn: Conn, spool_dir: str, *, renew_every: float | None = None,
                 clock: Callable[[], float] | None = None):
        self.conn = conn
        self.renew_every = renew_every
        self._clock = clock or time.monotonic
        self._held_timers = clock is None
        self._spool = _Spool(os.path.join(spool_dir, "lease-spool.jsonl"))
        # Delivery in spool order: nothing new is sent directly while older
        # messages wait in the spool.
        self._send_lock = threading.Lock()
        # The jobs whose renew thread runs (close() ends them), and whether
        # close() was called.
        self._jobs_lock = threading.Lock()
        self._jobs: set[Job] = set()
        self._closed = False
        # The sends under way (each found the worker open): close() waits
        # for them, so that nothing is sent after it returns.
        self._sending = 0
        self._sends_done = threading.Condition(self._jobs_lock)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Ends every job the worker runs, as ``Job.stop`` does (their
        ``stopped`` is set, cause JOB_ENDED; their renewals stop; each lease
        runs out on the coordinator's clock), waits for their renew threads
        to end and for the sends under way (a ``progress`` or ``complete``
        that found the worker open is answered before close() returns; at
        most 10 s in all: a renewal in flight ends when answered or at its
        interval), and closes the spool: what it holds is replayed by the
        next LeaseWorker on the directory. From then on the worker sends
        nothing: ``accept``, and a job's ``renew``, ``progress`` and
        ``complete``, raise WorkerClosed. Closing twice is harmless.

        ``close()`` may be called from a job's ``on_cancel`` (the operator
        cancelled the job: the agent shuts down), which runs on that job's
        renew thread: it waits for the other jobs' threads, not for its
        own, which ends when ``on_cancel`` returns; the cancel request is
        then not acknowledged (the worker sends nothing after close; the
        lease runs out on the coordinator's clock)."""
        with self._jobs_lock:
            if self._closed:
                return
            self._closed = True
            jobs = list(self._jobs)
            self._jobs.clear()
        for job in jobs:
            job._end(JOB_ENDED)
        me = threading.current_thread()
        deadline = time.monotonic() + _CLOSE_WAIT
        try:
            for job in jobs:
                # A job's on_cancel runs on its renew thread, and may be
                # what called close(): that thread ends when on_cancel
                # returns (the worker, closed, acknowledges the cancel no
                # more), and joining it here would join the caller.
                if job._thread is not None and job._thread is not me:
                    job._thread.join(max(deadline - time.monotonic(), 0.0))
                    if job._thread.is_alive():
                        log.warning("tether: lease worker closed with job %r's renew thread still running", job.job_id)
            self._await_sends(deadline)
        finally:
            self._spool.close()

    def _await_sends(self, deadline: float) -> None:
        # A send that found the worker open before it closed (a job's
        # progress or complete, a renewal) goes out before close() returns,
        # not after. (None is under way on the thread running on_cancel,
        # which may be what called close().)
        with self._sends_done:
            while self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("tether: lease worker closed with a send still under way")
                    return
                self._sends_done.wait(left)

    def _track(self, job: "Job") -> bool:
        with self._jobs_lock:
            if self._closed:
                return False
            self._jobs.add(job)
            return True

    def _untrack(self, job: "Job") -> None:
        with self._jobs_lock:
            self._jobs.discard(job)

    @property
    def pending(self) -> int:
        return len(self._spool.pending)

    def _send(self, kind: str, request: dict, timeout: float | None = None) -> dict:
        with self._jobs_lock:
            if self._closed:
                raise WorkerClosed()
            self._sending += 1
        try:
            return self.conn.call("LeaseService", _METHODS[kind], request, timeout=timeout)
        finally:
            with self._sends_done:
                self._sending -= 1
                self._sends_done.notify_all()

    def replay(self) -> int:
        """Delivers the spooled messages in order; returns how many the
        coordinator answered. Stops at the first the control plane could not
        be reached for. Each is judged on its own identity, generation and
        sequence: a result from a generation that expired meanwhile is
        recorded, never accepted."""
        with self._send_lock:
            return self._replay_locked()

    def _replay_locked(self) -> int:
        delivered = 0
        while True:
            entry = self._spool.first()
            if entry is None:
                return delivered
            n, kind, request = entry
            try:
                self._send(kind, request)
            except ConnectError as e:
                if _retryable(e):
                    raise
                log.warning("tether: lease spool: dropping a message the control plane refuses: %s", e)
            self._spool.done(n)
            delivered += 1

    def _deliver(self, kind: str, request: dict) -> dict:
        with self._send_lock:
            if self._closed:
                raise WorkerClosed()
            if self._spool.pending:
                try:
                    self._replay_locked()
                except ConnectError:
                    self._spool.append(kind, request)
                    raise Spooled(kind) from None
            try:
                return self._send(kind, request)
            except ConnectError as e:
                if not _retryable(e):
                    raise
                self._spool.append(kind, request)
                raise Spooled(kind) from e

    def accept(self, offered: dict, *, on_cancel: Callable[[dict], Any] | None = None) -> "Job":
        """ACKs an offered lease (which must be this agent's) and starts
        renewing it. The job's ``stopped`` event is set when the coordinator
        requests cancellation (cause LEASE_CANCELLED), says the generation
        lost authority (LEASE_LOST), records an ownership conflict on it
        (OWNERSHIP_CONFLICT: execution halts until the coordinator resolves
        it), or the worker ends it (JOB_ENDED, also at the worker's close,
        and when the control plane refuses a renewal because the agent may
        not act — its node's exit was confirmed, or its credential is dead
        (failed_precondition, unauthenticated, permission_denied) —, kept
        in ``refusal``).
        An answer (to the ACK, a renewal or a progress report) whose lease
        names another job, or another lease of this one, is not this job's
        answer: nothing in it is taken, and the job stops (LEASE_LOST, its
        ``detail`` naming the ids the answer carried, clipped).
        A closed worker raises WorkerClosed without acknowledging anything."""
        if self._closed:
            raise WorkerClosed()
        sent = self._clock()
        req = {"jobId": offered["jobId"], "leaseId": offered["leaseId"], "leaseGeneration": str(offered.get("leaseGeneration", "0")), "sentAt": _now()}
        with self._send_lock:
            self._replay_locked()
            resp = self._send("ack", req)  # an ACK is never spooled: a late ACK is worthless
        decision = resp.get("decision")
        if not isinstance(decision, dict):
            decision = {}
        if decision.get("outcome") == "OUTCOME_REJECTED":
            raise AckRefused(offered["jobId"], decision)
        lease = resp.get("lease")
        if not isinstance(lease, dict):
            # An accepted decision with no lease (a path's forged answer):
            # nothing of the coordinator's to run under. Refused in the
            # SDK's words, as the TypeScript worker's "no lease in the
            # answer", not a KeyError from inside the SDK (rogue44j test).
            raise AckRefused(offered["jobId"], {"reason": "no lease in the answer"})
        job = Job(self, lease if _names_another(lease, offered["jobId"], offered["leaseId"]) is None else offered,
                  on_cancel, offered=offered)
        if not self._track(job):
            # Closed while the ACK was under way: the job never begins, and
            # its lease runs out on the coordinator's clock.
            job._end(JOB_ENDED)
            raise WorkerClosed()
        # The ACK's answer is acted on as any other: a job this agent
        # already held (its ACK a DUPLICATE, after a restart) may already
        # have a cancel request, and its work must not begin as if not.
        job._held(sent, lease, decision)
        job._observe(lease, job.generation, decision)
        if decision.get("outcome") == "OUTCOME_DUPLICATE" and not job.stopped.is_set():
            # A repeated ACK grants no window (the coordinator counted the
            # generation's from the first ACK or the last renewal): the
            # resumed job proves one with a renewal now, and without an
            # answer it has none and stops.
            with job._lock:
                job._held_until = sent
            try:
                job.renew()
            except Exception as e:  # noqa: BLE001 — no answer: no window
                log.warning("tether: lease renew of resumed job %s failed: %s", job.job_id, e)
            job._check_held()
        job._start()
        return job


class Job:
    """The work done under one generation of one job's lease."""

    def __init__(self, worker: LeaseWorker, lease: dict, on_cancel: Callable[[dict], Any] | None, *, offered: dict | None = None):
        self.worker = worker
        self.lease = lease
        # The generation this job accepted: its claims and fencing headers
        # speak for it, whatever later generation an answer shows, so a job
        # that lost its lease never passes for its successor. It is the
        # lease offered and acknowledged, not the one the ACK's answer
        # names (a peer gone wrong could name another generation: the Go
        # job claims the offered one too).
        acked = offered if offered is not None else lease
        self._job_id = acked["jobId"]
        self._lease_id = acked["leaseId"]
        self._generation = _wire.uint64(acked.get("leaseGeneration"))
        # The generation's lease duration, as offered: the coordinator fixes
        # it for the generation (no renewal changes it), so an answer naming
        # a longer one is not taken for the job's window nor its renew
        # interval. Taken from the answers, a path's forged ACK answer (a
        # day's duration, or the largest one a duration holds) had the job
        # renew every third of it, never again within its lease (the
        # largest: its renew thread died, the wait too long for the
        # platform), deaf to its cancel and working on past its lease's
        # expiry at the coordinator for as long (rogue44a test). When the
        # offer names none (one its caller built from the ids it was
        # handed), the ACK's answer fixes it, as the offer would: taken from
        # each answer, one forged accepted renewal naming a day moved the
        # job's bound a day on, and cut off from its coordinator after it
        # the job worked on past its lease's expiry for the day (rogue46c
        # test). None: neither named one (no window is proven).
        self._duration = _wire.parse_duration(acked.get("leaseDuration")) if offered is not None else None
        if not self._duration and offered is not None and _names_another(lease, offered["jobId"], offered["leaseId"]) is None:
            self._duration = _wire.parse_duration(lease.get("leaseDuration"))
        self.on_cancel = on_cancel
        #: Set when the job must stop; ``cause`` says why.
        self.stopped = threading.Event()
        #: Set when the coordinator requested cancellation.
        self.cancelled = threading.Event()
        self.cause: str | None = None
        self._lock = threading.Lock()
        # A job this agent already held (its ACK a DUPLICATE: a process
        # that restarted after it renewed and reported progress) goes on
        # from the sequences the coordinator accepted, not from 0 again,
        # which would have its renewals refused stale until the lease
        # lapsed and its reports kept as late progress.
        same = _wire.uint64(lease.get("leaseGeneration")) == self._generation
        self._renew_seq = _wire.uint64(lease.get("renewSequence")) if same else 0
        self._progress_seq = _wire.uint64(lease.get("progressSequence")) if same else 0
        self._cancel_seen = False
        self._thread: threading.Thread | None = None
        self.done = threading.Event()
        # The bound of the authority the job can prove, on the worker's
        # clock: the last accepted ACK's or renewal's send time plus the
        # lease duration; None while not known.
        self._held_until: float | None = None
        self._held_timer: threading.Timer | None = None
        #: Set when the job stopped because no accepted renewal covered the
        #: worker's clock any more (cause LEASE_LOST).
        self.unconfirmed = False
        #: The control plane's refusal of the agent itself (its node's exit
        #: was confirmed) that ended the job (cause JOB_ENDED); else None.
        self.refusal: ConnectError | None = None
        #: Why the job stopped, in words, when an answer named another job
        #: or another lease of this one (cause LEASE_LOST); else None.
        self.detail: str | None = None

    @property
    def job_id(self) -> str:
        return self._job_id

    @property
    def generation(self) -> int:
        """The generation this job accepted (``lease`` shows the last answer)."""
        return self._generation

    def headers(self) -> dict[str, str]:
        """The fencing headers a tool server's Fence checks."""
        return {"Tether-Job-Id": self.job_id, "Tether-Lease-Generation": str(self.generation)}

    def _claim(self) -> dict:
        return {"jobId": self._job_id, "leaseId": self._lease_id, "leaseGeneration": str(self._generation), "sentAt": _now()}

    def _lease_duration(self, lease: dict) -> timedelta | None:
        """The lease duration an answer's lease names, never longer than
        the generation's (the offer's, or the ACK answer's when the offer
        named none); None when it names none."""
        dur = _wire.parse_duration(lease.get("leaseDuration"))
        if dur is not None and self._duration is not None and dur > self._duration:
            return self._duration
        return dur

    def _start(self) -> None:
        every = self.worker.renew_every
        if not every:
            dur = self._lease_duration(self.lease) or self._duration
            every = max(dur.total_seconds() / 3 if dur else 10.0, 0.01)
        self._every = every
        self._thread = threading.Thread(target=self._renew_loop, name=f"tether-lease-{self.job_id}", daemon=True)
        self._thread.start()

    def _end(self, cause: str, detail: str | None = None) -> None:
        with self._lock:
            if self.cause is None:
                self.cause = cause
                self.detail = detail
            if self._held_timer is not None:
                self._held_timer.cancel()
        self.stopped.set()

    def _held(self, sent: float, lease: dict | None, decision: dict | None) -> None:
        """Extends the job's bound after an answer to a message sent at
        ``sent`` (the worker's clock): only an accepted ACK or renewal of the
        job's own generation grants a window, counted by the coordinator
        from its receipt, so sent plus the lease duration is never later
        than the expiry it set."""
        decision = decision or {}
        if not lease or decision.get("outcome") != "OUTCOME_ACCEPTED" or \
                decision.get("auditEvent") not in ("AUDIT_EVENT_ACKED", "AUDIT_EVENT_RENEWED") or \
                _wire.uint64(lease.get("leaseGeneration")) != self._generation or lease.get("state") != "LEASE_STATE_ACTIVE" or \
                _names_another(lease, self._job_id, self._lease_id) is not None:
            return
        # An answer naming no duration proves no window past its send
        # time: the bound is set there, as the Go and TypeScript workers
        # set it, and the job stops at it. Skipped, an ACK's answer naming
        # none (nor the offer) left the job with no bound at all: cut off
        # from its coordinator it worked on for ever (rogue46c test).
        dur = self._lease_duration(lease)
        until = sent + (dur.total_seconds() if dur else 0.0)
        with self._lock:
            if self._held_until is not None and until <= self._held_until:
                return
            self._held_until = until
            if self.worker._held_timers and not self.stopped.is_set():
                if self._held_timer is not None:
                    self._held_timer.cancel()
                self._held_timer = threading.Timer(max(until - self.worker._clock(), 0.0), self._check_held)
                self._held_timer.daemon = True
                self._held_timer.start()

    def _check_held(self) -> bool:
        """Stops the job once the worker's clock reached its bound; reports
        whether it did."""
        with self._lock:
            until = self._held_until
        if until is None or self.worker._clock() < until:
            return False
        if not self.stopped.is_set():
            self.unconfirmed = True
            log.warning("tether: job %s: no renewal the coordinator accepted covers the worker's clock any more; "
                        "authority cannot be proven, the job stops", self.job_id)
        self._end(LEASE_LOST)
        return True

    def stop(self) -> None:
        """Ends the renew loop without a message (the lease runs out on the
        coordinator's clock)."""
        self._end(JOB_ENDED)

    def _renew_loop(self) -> None:
        try:
            while not self.stopped.wait(self._every):
                if self._check_held():
                    # No renewal sent now could prove the time between.
                    break
                try:
                    # Each renewal is given the interval to be answered,
                    # as the Go and TypeScript workers' are: a coordinator
                    # that holds one must not hold the loop (and the job's
                    # cancel and loss) for the connection's timeout.
                    self.renew(timeout=self._every)
                except WorkerClosed:
                    break
                except ConnectError as e:
                    if e.code in (FAILED_PRECONDITION, UNAUTHENTICATED, PERMISSION_DENIED):
                        # The control plane refuses the agent itself, not
                        # this lease (whose refusals are decisions): its
                        # node's exit was confirmed (failed_precondition: a
                        # launcher's attestation while it was cut off), or
                        # its credential is dead (unauthenticated,
                        # permission_denied: the node was terminated), the
                        # refusals the Agent aborts on. Each renewal is kept
                        # as evidence against that exit and none will be
                        # accepted: the job is told to stop now, not when
                        # its window lapses on the worker's clock. A worker
                        # whose path withheld its lease traffic while its
                        # node was stopped (the stop's cancel request never
                        # reached the job) worked on for the lease's whole
                        # window after its stop (rogue43U test).
                        log.warning("tether: lease renew of %s refused, the agent may not act; the job ends: %s", self.job_id, e)
                        self.refusal = e
                        self._end(JOB_ENDED)
                        break
                    if not _retryable(e):
                        log.warning("tether: lease renew of %s refused: %s", self.job_id, e)
                except Exception as e:  # noqa: BLE001 — the loop is how the job hears its cancel
                    # An answer of the wrong shape (a proxy's, or a hostile
                    # peer's) judges nothing: the next renewal asks again.
                    log.warning("tether: lease renew of %s: an answer of the wrong shape (%s: %s)", self.job_id, e.__class__.__name__, e)
        finally:
            self.worker._untrack(self)
            self.done.set()

    def renew(self, *, timeout: float | None = None) -> dict:
        """Renews once (the loop calls it on schedule) and acts on the
        answer. ``timeout`` bounds the wait for the answer (default the
        connection's; the loop's is its interval)."""
        with self._lock:
            self._renew_seq += 1
            seq = self._renew_seq
        gen = self.generation
        sent = self.worker._clock()
        resp = self.worker._send("renew", {**self._claim(), "renewSequence": str(seq)}, timeout)
        self._held(sent, resp.get("lease"), resp.get("decision"))
        self._observe(resp.get("lease"), gen, resp.get("decision"))
        return resp.get("decision", {})

    def _observe(self, lease: dict | None, generation: int, decision: dict | None = None) -> None:
        if not lease:
            return
        another = _names_another(lease, self._job_id, self._lease_id)
        if another is not None:
            # Not this job's answer (a path that replays, caches or crosses
            # answers): generations count per job (every job's first is 1),
            # so another job's of the same generation passed for this one's,
            # its accepted renewal moving the job's bound and its cancel
            # request run (on_cancel) and acknowledged as the job's own.
            # Nothing in it is taken (not its lease, its cancel, its
            # conflict, its window), and the job, whose own answer never
            # came, stops.
            log.warning("tether: a lease answer of job %s names another job or lease; the job stops: %s", self.job_id, another)
            self._end(LEASE_LOST, another)
            return
        if lease.get("ownershipConflict") and _wire.uint64(lease.get("leaseGeneration")) == generation or \
                (decision or {}).get("auditEvent") == "AUDIT_EVENT_OWNERSHIP_CONFLICT":
            # Another identity claims this generation: whatever else the
            # answer says (the lease stays ACTIVE until the coordinator
            # resolves it or it expires), the work must not go on as if it
            # were ours.
            with self._lock:
                self.lease = lease
            self._end(OWNERSHIP_CONFLICT)
            return
        with self._lock:
            self.lease = lease
            first_cancel = bool(lease.get("cancelRequested")) and not self._cancel_seen
            if first_cancel:
                self._cancel_seen = True
        lost = _wire.uint64(lease.get("leaseGeneration")) != generation or lease.get("state") != "LEASE_STATE_ACTIVE"
        if first_cancel:
            self.cancelled.set()
            self._end(LEASE_CANCELLED)
            if self.on_cancel is not None:
                try:
                    self.on_cancel(lease)
                except Exception:
                    log.exception("tether: on_cancel failed")
            if not lease.get("cancelAck") and not lost:
                try:
                    self.worker._deliver("cancelAck", self._claim())
                except (Spooled, WorkerClosed):
                    pass
                except ConnectError as e:
                    log.warning("tether: lease cancel ack of %s failed: %s", self.job_id, e)
        if lost:
            self._end(LEASE_LOST)

    def progress(self, value: str) -> dict:
        """Reports progress with the next sequence; raises Spooled when the
        control plane is unreachable (the report is on disk)."""
        with self._lock:
            self._progress_seq += 1
            seq = self._progress_seq
        gen = self.generation
        resp = self.worker._deliver("progress", {**self._claim(), "progressSequence": str(seq), "progressValue": value})
        self._observe(resp.get("lease"), gen, resp.get("decision"))
        return resp.get("decision", {})

    def complete(self, result: str = SUCCESS, detail: str = "") -> dict:
        """Reports the terminal result (SUCCESS, FAILED or CANCELLED) and ends
        the job. May raise Spooled, like progress."""
        try:
            resp = self.worker._deliver("complete", {**self._claim(), "result": result, "detail": detail})
            lease = resp.get("lease")
            if lease and _names_another(lease, self._job_id, self._lease_id) is None:
                self.lease = lease
            return resp.get("decision", {})
        finally:
            self._end(JOB_ENDED)


def _names_another(lease: Any, job_id: str, lease_id: str) -> str | None:
    """Why an answer's lease is not the job's own (it names another job, or
    another lease of the job), or None when it is. The ids are quoted
    clipped: the answer's are the path's to choose, and the reason is kept
    (the job's ``detail``) and logged. The Go and TypeScript workers'
    namesAnother."""
    if not isinstance(lease, dict):
        return None  # no ids: an answer of the wrong shape, judged as such
    if lease.get("jobId") == job_id and lease.get("leaseId") == lease_id:
        return None
    what = "job " + _clipped(lease.get("jobId"))
    if lease.get("jobId") == job_id:
        what = "lease " + _clipped(lease.get("leaseId"))
    return f"the answer names {what}, not the job's lease {_clipped(lease_id)}: it is not this job's answer, and its own never came"


def _clipped(value: Any) -> str:
    """value quoted, at most 64 of its characters (a value that is not
    text, as its JSON)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > 64:
        return json.dumps(text[:64]) + "\u2026"
    return json.dumps(text)
