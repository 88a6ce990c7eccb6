import { Code, ConnectError } from "@connectrpc/connect";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";

import { Conn } from "./conn.js";
import { AuditEvent, LeaseState, Outcome, TerminalResult, type Decision, type Lease } from "./gen/tether/v1/lease_pb.js";
import { endsRun, msOf, textOf } from "./internal.js";

/** Why a job's signal aborted. */
export type JobEndKind = "cancelled" | "lost" | "ended";

/**
 * The reason of a {@link Job.signal}:
 * - "cancelled": the coordinator requested cancellation; stop and
 *   complete with CANCELLED (or FAILED);
 * - "lost": the coordinator says this generation no longer has authority
 *   (it expired, was superseded, is in an ownership conflict, or the job is
 *   terminal), or no renewal it accepted covers the worker's clock any more
 *   (the last accepted ACK's or renewal's send time plus the lease duration
 *   passed: authority cannot be proven), or an answer names another job,
 *   or another lease of this one (not this job's answer: nothing in it is
 *   taken, and the job's own never came) — detail says which;
 * - "ended": the worker completed or stopped the job, or the control plane
 *   refused a renewal because the agent may not act (its node's exit was
 *   confirmed: failed_precondition; its credential is dead:
 *   unauthenticated, permission_denied) — detail says which, and such a
 *   refusal (a ConnectError) is the error's cause.
 */
export class JobEnded extends Error {
  override readonly name = "JobEnded";
  constructor(
    readonly kind: JobEndKind,
    readonly jobId: string,
    readonly detail: string,
    cause?: unknown,
  ) {
    super(`tether: job ${jobId} ${kind}${detail ? `: ${detail}` : ""}`, cause === undefined ? undefined : { cause });
  }
}

/**
 * Thrown by a closed {@link LeaseWorker}'s accept and by its jobs' renew,
 * progress and complete: nothing is sent after {@link LeaseWorker.close}
 * (the Go SDK's ErrWorkerClosed, the Python SDK's WorkerClosed).
 */
export class WorkerClosed extends Error {
  override readonly name = "WorkerClosed";
  constructor() {
    super("tether: the lease worker is closed");
  }
}

/**
 * The longest a node timer waits (2^31 - 1 ms, some 24.8 days): one asked
 * for longer fires after 1 ms, so a lease of more than 74 days (renewed
 * every third of it) renewed in a loop, and its bound never ended it.
 */
const maxTimerMs = 2 ** 31 - 1;

/** How long close() waits for its jobs' renewals in flight (and an onCancel they run) to settle, in ms. */
const closeWaitMs = 10_000;

// The worker's side of its jobs, not part of the package's API (each
// class's static block sets them, with access to its private fields): the
// worker tracks the jobs whose renew loop runs, and close() ends them.
let trackJob: (worker: LeaseWorker, job: Job) => boolean;
let untrackJob: (worker: LeaseWorker, job: Job) => void;
let closeJob: (job: Job) => Promise<unknown>;
// Counts a call to the control plane under way until it settles, for
// close() to wait for: nothing is sent after close() resolves.
let sending: <T>(worker: LeaseWorker, call: Promise<T>) => Promise<T>;

/** Options for a {@link LeaseWorker}. */
export interface LeaseWorkerOptions {
  /** The agent's connection: its credential is the holder identity the coordinator binds every message to. */
  conn: Conn;
  /**
   * Stamps sent_at (evidence only: the coordinator decides on its own
   * clock), and bounds what a job can prove (below). Default Date.now, with
   * performance.now for the bound.
   */
  now?: () => number;
  /**
   * How often a job renews, in ms; default a third of its lease duration.
   * It schedules renewals; with an injected `now` the job's bound is also
   * checked at each of these ticks (on the default clock a timer ends the
   * job at it).
   */
  renewEveryMs?: number;
  warn?: (message: string) => void;
}

/** Options for one accepted job. */
export interface JobOptions {
  /**
   * Runs when the coordinator's cancel request is first seen, after the
   * job's signal aborted and before the worker acknowledges the request. It
   * should return once the job has stopped starting new work. One that
   * throws (or rejects) is reported through the worker's warn; the request
   * is acknowledged and the job ends all the same.
   */
  onCancel?: (lease: Lease) => void | Promise<void>;
}

/**
 * LeaseWorker works under fenced job leases for one agent: it ACKs offers,
 * keeps each job's lease renewed until the coordinator says it ended,
 * reports progress and terminal results, and turns a cancel request into an
 * aborted signal plus a callback and an acknowledgement. Expiry is only ever
 * learnt from the coordinator; the worker's clock schedules renewals and
 * bounds what a job can prove: an accepted ACK or renewal covers its send
 * time plus the lease duration (the coordinator counts from its receipt,
 * never earlier), and once the worker's clock passes the last such bound
 * without another (a partition) the job ends ("lost") at or before the
 * coordinator's expiry. It never extends authority; progress moves no bound.
 *
 * Unlike the Go SDK's worker it keeps no spool: a progress report or result
 * the control plane could not be reached for is thrown to the caller.
 */
export class LeaseWorker {
  readonly conn: Conn;
  readonly #now: () => number;
  /** The worker's clock for a job's bound: monotonic unless injected. */
  readonly heldNow: () => number;
  /** Whether heldNow is the default (monotonic) clock, on which a timer ends a job at its bound. */
  readonly heldTimers: boolean;
  readonly #renewEvery?: number;
  readonly #warn: (message: string) => void;
  readonly #jobs = new Set<Job>();
  readonly #calls = new Set<Promise<unknown>>();
  #closed = false;

  constructor(options: LeaseWorkerOptions) {
    this.conn = options.conn;
    this.#now = options.now ?? Date.now;
    this.heldNow = options.now ?? (() => performance.now());
    this.heldTimers = options.now === undefined;
    this.#renewEvery = options.renewEveryMs;
    this.#warn = options.warn ?? (() => {});
  }

  /** sent_at for a message. */
  sentAt() {
    return timestampFromMs(this.#now());
  }

  /** Whether {@link LeaseWorker.close} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Ends every job the worker runs, as {@link Job.stop} does (their signals
   * abort with a {@link JobEnded} "ended", "the worker was closed"; their
   * renewals stop, one in flight is aborted; each lease runs out on the
   * coordinator's clock), and resolves once their renewals in flight (and
   * an onCancel one runs) and the calls under way (a progress or complete
   * that found the worker open) have settled, after at most 10 s: nothing
   * goes out after it resolves. From then on
   * the worker sends nothing: accept, and a job's renew, progress and
   * complete, throw {@link WorkerClosed}. Closing twice is harmless.
   *
   * It may be called (and awaited) from a job's onCancel (the operator
   * cancelled the job: the agent shuts down): it does not wait for a job
   * whose onCancel runs, which may be the caller; the cancel request is
   * then not acknowledged (the worker sends nothing after close; the lease
   * runs out on the coordinator's clock).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const jobs = [...this.#jobs];
    this.#jobs.clear();
    // The calls under way (a progress or complete that found the worker
    // open, a renewal) settle before close() resolves: none goes out after.
    // (None is under way for a job running onCancel, which may be awaiting
    // this close(): onCancel runs once its call settled.)
    const settled = [...jobs.map((j) => closeJob(j)), ...this.#calls];
    let bound: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled(settled),
      new Promise<void>((resolve) => {
        bound = setTimeout(() => {
          this.#warn("tether: lease worker closed with a job's renewal still in flight (its onCancel has not returned)");
          resolve();
        }, closeWaitMs);
        bound.unref?.();
      }),
    ]);
    clearTimeout(bound);
  }

  static {
    // Tracks a job whose renew loop runs; false once the worker is closed.
    trackJob = (worker, job) => {
      if (worker.#closed) return false;
      worker.#jobs.add(job);
      return true;
    };
    untrackJob = (worker, job) => void worker.#jobs.delete(job);
    sending = (worker, call) => {
      worker.#calls.add(call);
      const settle = () => void worker.#calls.delete(call);
      call.then(settle, settle);
      return call;
    };
  }

  /**
   * ACKs an offered lease (which must be this agent's) and starts renewing
   * it. Throws when the coordinator rejects the ACK, and
   * {@link WorkerClosed} (without acknowledging) once the worker is closed.
   */
  async accept(offered: Lease, options: JobOptions = {}): Promise<Job> {
    if (this.#closed) throw new WorkerClosed();
    const sent = this.heldNow();
    const resp = await sending(this, this.conn.lease.ack({
      jobId: offered.jobId,
      leaseId: offered.leaseId,
      leaseGeneration: offered.leaseGeneration,
      sentAt: this.sentAt(),
    }));
    if (resp.decision?.outcome === Outcome.REJECTED || !resp.lease) {
      throw new Error(`tether: ack of job ${JSON.stringify(offered.jobId)} refused: ${resp.decision?.reason ?? "no lease in the answer"}`);
    }
    // Closed while the ACK was under way: the job never begins, and its
    // lease runs out on the coordinator's clock.
    if (this.#closed) throw new WorkerClosed();
    // The generation's lease duration is the offer's, or the ACK answer's
    // when the offer names none (the coordinator fixes it; no renewal
    // changes it): an answer naming a longer one sets neither the renew
    // interval nor the job's window (leaseMs).
    const fixed = generationMs(offered, resp.lease);
    const every = this.#renewEvery ?? Math.max((leaseMs(resp.lease, fixed) || fixed) / 3, 10);
    return Job.accepted(this, offered, resp.lease, resp.decision, sent, options, every, this.#warn);
  }
}

/** The work done under one generation of one job's lease. */
export class Job {
  readonly #worker: LeaseWorker;
  readonly #options: JobOptions;
  // The generation this job accepted: its claims and fencing headers speak
  // for it, whatever later generation an answer shows, so a job that lost
  // its lease never passes for its successor.
  readonly #jobId: string;
  readonly #leaseId: string;
  readonly #generation: bigint;
  // The generation's lease duration in ms (generationMs; 0: unknown): it
  // bounds the one an answer names.
  readonly #durationMs: number;
  readonly #abort = new AbortController();
  readonly #warn: (message: string) => void;
  #lease: Lease;
  #renewSequence = 0n;
  #progressSequence = 0n;
  #cancelSeen = false;
  #timer?: NodeJS.Timeout;
  // The bound of the authority the job can prove, on the worker's clock
  // (LeaseWorker.heldNow): the last accepted ACK's or renewal's send time
  // plus the lease duration; undefined while not known.
  #heldUntil?: number;
  #heldTimer?: NodeJS.Timeout;
  #renewing = false;
  // The renew loop's renewal in flight, and what it runs on the answer.
  #inflight?: Promise<unknown>;
  // Whether the job runs its onCancel: close() does not wait for such a
  // job (the callback may be what called it).
  #inOnCancel = false;
  // Aborts when the job ends: the loop's renewal in flight with it.
  readonly #halt = new AbortController();
  #done: Promise<void>;
  #markDone!: () => void;

  constructor(worker: LeaseWorker, offered: Lease, lease: Lease, options: JobOptions, renewEveryMs: number, warn: (m: string) => void) {
    this.#worker = worker;
    this.#lease = lease;
    this.#options = options;
    // The lease offered and acknowledged, not the one the answer names (a
    // peer gone wrong could name another generation: the Go job claims
    // the offered one too).
    this.#jobId = offered.jobId;
    this.#leaseId = offered.leaseId;
    this.#generation = offered.leaseGeneration;
    this.#durationMs = generationMs(offered, lease);
    if (lease.leaseGeneration === offered.leaseGeneration && !namesAnother(lease, offered.jobId, offered.leaseId)) {
      // A job this agent already held (its ACK a DUPLICATE: a process that
      // restarted after it renewed and reported progress) goes on from the
      // sequences the coordinator accepted, not from 0 again, which would
      // have its renewals refused stale until the lease lapsed and its
      // reports kept as late progress.
      this.#renewSequence = lease.renewSequence;
      this.#progressSequence = lease.progressSequence;
    }
    this.#warn = warn;
    this.#done = new Promise((resolve) => (this.#markDone = resolve));
    // One renewal at a time, each given the interval to be answered (as
    // the Go worker's): against a coordinator that is slow or never
    // answers, a tick while one is in flight is skipped rather than piling
    // up requests (and their memory) without bound.
    const every = Math.min(renewEveryMs, maxTimerMs);
    this.#timer = setInterval(() => {
      if (this.#checkHeld()) return; // no renewal sent now could prove the time between
      if (this.#renewing) return;
      this.#renewing = true;
      this.#inflight = this.renew({ timeoutMs: every, signal: this.#halt.signal })
        .catch((err) => {
          if (this.#halt.signal.aborted) return;
          if (endsRun(err)) {
            // The control plane refuses the agent itself, not this lease
            // (whose refusals are decisions): its node's exit was
            // confirmed (failed_precondition: a launcher's attestation
            // while it was cut off), or its credential is dead
            // (unauthenticated, permission_denied: the node was
            // terminated), the refusals the agent's run ends on. Each
            // renewal is kept as evidence against that exit, and none will
            // be accepted: the job is told to stop now, not when its
            // window lapses on the worker's clock. A worker whose path
            // withheld its lease traffic while its node was stopped (the
            // stop's cancel request never reached the job) worked on for
            // the lease's whole window, up to the policy's ten minutes,
            // after its stop's record was written (rogue44B test; the Go
            // worker's rogue43l).
            this.#warn(`tether: lease renew of job ${lease.jobId} refused, the agent may not act; the job ends: ${err.message}`);
            this.#end(new JobEnded("ended", lease.jobId, `the control plane refuses the agent's renewal: ${err.message}`, err));
            return;
          }
          this.#warn(`tether: lease renew of job ${lease.jobId} failed: ${(err as Error).message}`);
        })
        .finally(() => (this.#renewing = false));
    }, every);
    if (!trackJob(worker, this)) this.#end(closedReason(this.#jobId));
  }

  static {
    // Ends the job for its worker's close(); resolves once its renewal in
    // flight has settled.
    closeJob = (job) => {
      job.#end(closedReason(job.#jobId));
      // A renewal running onCancel settles once onCancel returns, and
      // onCancel may be awaiting this very close(): not waited for.
      if (job.#inOnCancel) return Promise.resolve();
      return job.#inflight ?? Promise.resolve();
    };
  }

  /**
   * Starts a job on the lease an ACK's answer carries, acting on that
   * answer as on any other: a job this agent already held (its ACK a
   * DUPLICATE, after a restart) may already have a cancel request, and its
   * work must not begin as if it had not.
   */
  static async accepted(
    worker: LeaseWorker,
    offered: Lease,
    lease: Lease,
    decision: Decision | undefined,
    sent: number,
    options: JobOptions,
    renewEveryMs: number,
    warn: (m: string) => void,
  ): Promise<Job> {
    const job = new Job(worker, offered, lease, options, renewEveryMs, warn);
    job.#held(sent, lease, decision);
    await job.#observe(lease);
    if (decision?.outcome === Outcome.DUPLICATE && !job.signal.aborted) {
      // A repeated ACK grants no window (the coordinator counted the
      // generation's from the first ACK or the last renewal): the resumed
      // job proves one with a renewal now, and without an answer it has
      // none and ends.
      job.#heldUntil = sent;
      try {
        await job.renew();
      } catch (err) {
        warn(`tether: lease renew of resumed job ${lease.jobId} failed: ${(err as Error).message}`);
      }
      job.#checkHeld();
    }
    return job;
  }

  /**
   * Extends the job's bound after an answer to a message sent at `sent`:
   * only an accepted ACK or renewal of the job's own generation grants a
   * window, counted by the coordinator from its receipt, so sent plus the
   * lease duration is never later than the expiry it set.
   */
  #held(sent: number, lease: Lease | undefined, decision: Decision | undefined): void {
    if (!lease || decision?.outcome !== Outcome.ACCEPTED || lease.leaseGeneration !== this.#generation || lease.state !== LeaseState.ACTIVE) return;
    if (namesAnother(lease, this.#jobId, this.#leaseId)) return;
    if (decision.auditEvent !== AuditEvent.ACKED && decision.auditEvent !== AuditEvent.RENEWED) return;
    const until = sent + leaseMs(lease, this.#durationMs);
    if (this.#heldUntil !== undefined && until <= this.#heldUntil) return;
    this.#heldUntil = until;
    if (this.#worker.heldTimers) this.#armHeld();
  }

  /**
   * Ends the job at its bound on the default clock: a timer at the bound,
   * or at the longest a timer can wait, looking again then.
   */
  #armHeld(): void {
    if (this.#heldUntil === undefined || this.#abort.signal.aborted) return;
    if (this.#heldTimer) clearTimeout(this.#heldTimer);
    const wait = Math.min(Math.max(this.#heldUntil - this.#worker.heldNow(), 0), maxTimerMs);
    this.#heldTimer = setTimeout(() => {
      if (!this.#checkHeld()) this.#armHeld();
    }, wait);
    this.#heldTimer.unref?.();
  }

  /** Ends the job once the worker's clock reached its bound; reports whether it did. */
  #checkHeld(): boolean {
    if (this.#heldUntil === undefined || this.#worker.heldNow() < this.#heldUntil) return false;
    this.#end(
      new JobEnded(
        "lost",
        this.#jobId,
        "no renewal the coordinator accepted covers the worker's clock any more; authority cannot be proven (the coordinator was not reached)",
      ),
    );
    return true;
  }

  /** Aborts when the job must stop; its reason is a {@link JobEnded}. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** Resolves when the renew loop has ended. */
  get done(): Promise<void> {
    return this.#done;
  }

  /** The lease as the coordinator last answered it. */
  get lease(): Lease {
    return this.#lease;
  }

  /** The fencing headers a tool server's Fence checks before any side effect. */
  headers(): Record<string, string> {
    return { "Tether-Job-Id": this.#jobId, "Tether-Lease-Generation": String(this.#generation) };
  }

  /** Ends the renew loop without a message (the lease runs out on the coordinator's clock). */
  stop(): void {
    this.#end(new JobEnded("ended", this.#lease.jobId, "stopped by the worker"));
  }

  #end(reason: JobEnded): void {
    untrackJob(this.#worker, this);
    this.#halt.abort();
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    if (this.#heldTimer) clearTimeout(this.#heldTimer);
    this.#heldTimer = undefined;
    if (!this.#abort.signal.aborted) this.#abort.abort(reason);
    this.#markDone();
  }

  #claim() {
    return { jobId: this.#jobId, leaseId: this.#leaseId, leaseGeneration: this.#generation, sentAt: this.#worker.sentAt() };
  }

  /**
   * Renews the lease once (the renew loop calls it on schedule) and acts on
   * the answer: a cancel request aborts the job's signal, runs onCancel and
   * acknowledges; an answer saying the generation has no authority ends the
   * job. options.timeoutMs bounds the wait for the answer (the renew
   * loop's is its interval); a renewal that runs out, or whose
   * options.signal aborts, is not judged. Throws {@link WorkerClosed} once
   * the worker is closed.
   */
  async renew(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Decision | undefined> {
    if (this.#worker.closed) throw new WorkerClosed();
    if (this.#abort.signal.aborted) return undefined;
    this.#renewSequence++;
    const sent = this.#worker.heldNow();
    const resp = await sending(
      this.#worker,
      this.#worker.conn.lease.renew(
        { ...this.#claim(), renewSequence: this.#renewSequence },
        { timeoutMs: options.timeoutMs, signal: options.signal },
      ),
    );
    this.#held(sent, resp.lease, resp.decision);
    await this.#observe(resp.lease);
    return resp.decision;
  }

  async #observe(lease: Lease | undefined): Promise<void> {
    if (!lease) return;
    const another = namesAnother(lease, this.#jobId, this.#leaseId);
    if (another) {
      // Not this job's answer (a path that replays, caches or crosses
      // answers): generations count per job, so another job's of the same
      // generation passed for this one's, its accepted renewal moving the
      // job's bound and its cancel request run and acknowledged as the
      // job's own. Nothing in it is taken (not its lease, its cancel, its
      // window), and the job, whose own answer never came, ends.
      this.#end(new JobEnded("lost", this.#jobId, another));
      return;
    }
    this.#lease = lease;
    const firstCancel = lease.cancelRequested && !this.#cancelSeen;
    if (firstCancel) this.#cancelSeen = true;
    const lost = lostBecause(lease, this.#generation);
    if (firstCancel) {
      const reason = new JobEnded("cancelled", lease.jobId, "the coordinator requested cancellation");
      if (this.#timer) clearInterval(this.#timer); // renewals are refused once cancellation is requested
      this.#timer = undefined;
      this.#abort.abort(reason);
      this.#inOnCancel = true;
      try {
        await this.#options.onCancel?.(lease);
      } catch (err) {
        // A callback that fails (its cleanup threw) is reported, not a
        // reason to leave the request unacknowledged and the job running:
        // the Go worker acknowledges once OnCancel returns, the Python one
        // logs an on_cancel that raises and acknowledges all the same.
        this.#warn(`tether: onCancel of job ${lease.jobId} failed: ${textOf(err, "with a value that has no text")}`);
      } finally {
        this.#inOnCancel = false;
      }
      if (!lease.cancelAck && !lost && !this.#worker.closed) {
        try {
          const resp = await sending(this.#worker, this.#worker.conn.lease.cancelAck(this.#claim()));
          if (resp.lease && !namesAnother(resp.lease, this.#jobId, this.#leaseId)) this.#lease = resp.lease;
        } catch (err) {
          this.#warn(`tether: lease cancel ack of job ${lease.jobId} failed: ${(err as Error).message}`);
        }
      }
      this.#end(reason);
    }
    if (lost) this.#end(new JobEnded("lost", lease.jobId, lost));
  }

  /** Reports progress with the next sequence; throws {@link WorkerClosed} once the worker is closed. */
  async progress(value: string): Promise<Decision | undefined> {
    if (this.#worker.closed) throw new WorkerClosed();
    this.#progressSequence++;
    const resp = await sending(
      this.#worker,
      this.#worker.conn.lease.progress({ ...this.#claim(), progressSequence: this.#progressSequence, progressValue: value }),
    );
    await this.#observe(resp.lease);
    return resp.decision;
  }

  /**
   * Reports the terminal result (SUCCESS, FAILED or CANCELLED) and ends the
   * job; throws {@link WorkerClosed}, reporting nothing, once the worker is
   * closed.
   */
  async complete(result: TerminalResult, detail = ""): Promise<Decision | undefined> {
    if (this.#worker.closed) throw new WorkerClosed();
    try {
      const resp = await sending(this.#worker, this.#worker.conn.lease.complete({ ...this.#claim(), result, detail }));
      if (resp.lease && !namesAnother(resp.lease, this.#jobId, this.#leaseId)) this.#lease = resp.lease;
      return resp.decision;
    } finally {
      this.#end(new JobEnded("ended", this.#lease.jobId, "completed"));
    }
  }
}

/** The reason of the signal of a job its worker's close() ended. */
function closedReason(jobId: string): JobEnded {
  return new JobEnded("ended", jobId, "the worker was closed");
}

/**
 * Why an answer's lease is not the job's own (it names another job, or
 * another lease of it), or "" when it is. The ids are quoted clipped: the
 * answer's are the path's to choose, and the reason is kept and logged.
 */
function namesAnother(lease: Lease, jobId: string, leaseId: string): string {
  if (lease.jobId === jobId && lease.leaseId === leaseId) return "";
  const what = lease.jobId === jobId ? `lease ${clipped(lease.leaseId)}` : `job ${clipped(lease.jobId)}`;
  return `the answer names ${what}, not the job's lease ${clipped(leaseId)}: it is not this job's answer, and its own never came`;
}

/** s quoted, at most 64 of its characters. */
function clipped(s: string): string {
  return JSON.stringify(s.length > 64 ? `${s.slice(0, 64)}…` : s);
}

/**
 * The lease duration an answer's lease names, in milliseconds, never longer
 * than the generation's, `fixed` (generationMs; 0: unknown). Taken from the
 * answers, a path's one forged ACK answer naming a day had the job renew
 * every 8 hours (the longest, every 24.8 days: a timer's longest wait),
 * deaf to its cancel request and working on past its lease's expiry at the
 * coordinator (rogue44A.test.ts).
 */
function leaseMs(lease: Lease, fixed: number): number {
  const answered = msOf(lease.leaseDuration);
  if (fixed > 0 && answered > fixed) return fixed;
  return answered;
}

/**
 * The generation's lease duration in milliseconds, as the coordinator fixed
 * it: the offer's, or, when the offer names none (one its caller built from
 * the ids it was handed), the ACK's answer's (0 when neither names one, or
 * the answer is not the job's own). Taken from each answer, one forged
 * accepted renewal naming a day moved the job's bound a day on, and cut off
 * from its coordinator after it the job worked on past its lease's expiry
 * for the day (rogue46C.test.ts).
 */
function generationMs(offered: Lease, acked: Lease): number {
  const offeredMs = msOf(offered.leaseDuration);
  if (offeredMs > 0 || namesAnother(acked, offered.jobId, offered.leaseId)) return offeredMs;
  return msOf(acked.leaseDuration);
}

/** Why a coordinator answer says this generation has no authority, or "" when it still has. */
function lostBecause(lease: Lease, generation: bigint): string {
  if (lease.leaseGeneration !== generation) return `superseded by generation ${lease.leaseGeneration}`;
  if (lease.ownershipConflict) return `ownership conflict with ${lease.conflictHolder || "another holder"}`;
  if (lease.state === LeaseState.EXPIRED || lease.leaseExpired) return "the lease expired";
  if (lease.state !== LeaseState.ACTIVE) return `the lease is ${LeaseState[lease.state] ?? "not active"}`;
  return "";
}

/** Reports whether err means "not judged, try again later" rather than "judged" or "never judgeable". */
export function retryable(err: unknown): boolean {
  if (!(err instanceof ConnectError)) return true;
  return ![Code.InvalidArgument, Code.PermissionDenied, Code.NotFound, Code.Unimplemented, Code.FailedPrecondition, Code.OutOfRange].includes(err.code);
}

export { TerminalResult };
