// The tool server's half of lease fencing, as the Go SDK's agentsdk.Fence:
// a side effect carries the job id and the lease generation its caller
// holds (a LeaseWorker Job's headers()), and the fence refuses one whose
// generation is lower than the highest it has seen for that job; with a
// check, also one the coordinator did not issue or says may not act now.
import { Code, ConnectError } from "@connectrpc/connect";

import type { Conn } from "./conn.js";
import { LeaseState, type Lease } from "./gen/tether/v1/lease_pb.js";
import { dateOf } from "./internal.js";
import { gateCallId, gateCallNode } from "./toolgate.js";
import type { Clock } from "./verifier.js";

/** Headers a {@link Fence} reads: the job and the lease generation the caller holds. */
export const HeaderJobId = "Tether-Job-Id";
export const HeaderLeaseGeneration = "Tether-Lease-Generation";

const maxUint64 = (1n << 64n) - 1n;

/**
 * The longest job id the coordinator accepts, in UTF-8 bytes (the lease
 * record's bound on ids). A fence refuses a longer one, and one that is not
 * well-formed Unicode or holds a control character, as a job the
 * coordinator never issued, without asking it and without remembering it.
 */
export const MaxJobIdBytes = 256;

// A C0 or C1 control character (Go's unicode.IsControl).
const controlCharacter = /[\u0000-\u001f\u007f-\u009f]/;

/** Why job cannot be a job id the coordinator issued, or undefined when it can. It never quotes job. */
function jobIdProblem(job: string): string | undefined {
  if (job === "") return "the job id is empty";
  const bytes = Buffer.byteLength(job, "utf8");
  if (bytes > MaxJobIdBytes) return `a job id of ${bytes} bytes (the coordinator issues at most ${MaxJobIdBytes})`;
  if (Buffer.from(job, "utf8").toString("utf8") !== job) return "a job id that is not UTF-8"; // a lone surrogate
  if (controlCharacter.test(job)) return "a job id holding a control character";
  return undefined;
}

/** A generation as a fence takes it: a bigint in [1, 2^64). */
function validGeneration(generation: unknown): generation is bigint {
  return typeof generation === "bigint" && generation > 0n && generation <= maxUint64;
}

/** A side effect from a superseded lease generation: its caller no longer has authority to act. */
export class Fenced extends Error {
  override readonly name = "Fenced";
}

/**
 * A side effect claiming a generation the coordinator has not issued for
 * its job: the header is the caller's word, and a caller that could raise
 * the fence to a generation nobody holds would fence the real holder out.
 */
export class UnissuedGeneration extends Error {
  override readonly name = "UnissuedGeneration";
}

/**
 * A side effect under the job's current generation when that generation may
 * not act now: it is only offered (not accepted), expired or terminal, its
 * holder was asked to cancel or its exit was confirmed, or the coordinator
 * recorded an ownership conflict. The holder may believe it holds the lease; the coordinator says
 * it does not, and a fenced resource takes its word.
 */
export class NoAuthority extends Error {
  override readonly name = "NoAuthority";
}

/** The coordinator's answer about a job's lease, as a fence needs it. */
export interface Authority {
  /** The job's current generation: every one up to it was issued, every one below it is superseded. */
  generation: bigint;
  /** The current generation may act now: ACTIVE on the coordinator's clock, no cancel requested, no ownership conflict, its holder's exit not confirmed. */
  active: boolean;
  /** When an active generation's authority ends (ms since the epoch), as the coordinator stated it. */
  untilMs?: number;
  /** Why the generation may not act, when not active ("is EXPIRED", "was asked to cancel", ...). */
  why?: string;
  /**
   * The refusal is of the call the check named (a ToolGate call that is
   * neither the holder's nor one of its descendants'), not of the
   * generation, which may still act for its holder: a fence keeps what it
   * knows of the generation.
   */
  callerRefused?: boolean;
}

/**
 * Asks the coordinator about job's lease, for a side effect claiming
 * generation; throws {@link UnissuedGeneration} for a job it does not know,
 * another error when it could not be asked.
 */
export type GenerationCheck = (job: string, generation: bigint) => Promise<Authority>;

/**
 * The {@link GenerationCheck} that asks the control plane
 * (LeaseService.GetLease, which a tool server's token may call) naming the
 * generation claimed: the job's generation and whether it may act now — not
 * when its holder's exit was confirmed (the answer's holderExited; the
 * control plane keeps the side effect on the holder as activity after its
 * exit). The read is charged to the tool server's reads of that job when the answer
 * admits the generation named, and to its refusals otherwise: callers
 * claiming generations that are not the job's current one, or that may not
 * act, cannot spend the reads its holder's side effects need.
 *
 * Asked inside a {@link ToolGate} call's function ({@link gateCallId}), it
 * names the gate's call: the control plane then reads whose call it is from
 * its own ledger and keeps a side effect under an exited holder's
 * generation on the holder only when the call is the holder's, so a
 * stranger calling the tool with the holder's job and generation is refused
 * without framing the holder; and a call that is neither the holder's nor
 * one of its descendants' is refused under the holder's generation however
 * alive the holder is (notHoldersCall). The call must be one the gate began with the
 * tool-server token conn carries; another's is refused failed_precondition.
 * Asked elsewhere, it names no call (the read is weighed against the holder
 * whoever asked).
 */
export function issuedGenerations(conn: Conn): GenerationCheck {
  return async (job, generation) => {
    let lease: Lease | undefined;
    let holderExited = false;
    let notHoldersCall = false;
    try {
      const resp = await conn.lease.getLease({ jobId: job, leaseGeneration: generation, callId: gateCallId() });
      lease = resp.lease;
      holderExited = resp.holderExited; // false from a server without the field
      notHoldersCall = resp.notHoldersCall;
    } catch (err) {
      if (ConnectError.from(err).code === Code.NotFound) throw new UnissuedGeneration(`tether: fence: job ${JSON.stringify(job)} has no lease`);
      throw new Error(`tether: fence: asking the coordinator about job ${JSON.stringify(job)}'s lease: ${ConnectError.from(err).rawMessage}`);
    }
    const current = lease?.leaseGeneration ?? 0n;
    const state = lease?.state ?? LeaseState.UNSPECIFIED;
    if (state !== LeaseState.ACTIVE) return { generation: current, active: false, why: `is ${LeaseState[state] ?? state}` };
    if (notHoldersCall) {
      return { generation: current, active: false, why: "is not the holder's: the call is neither the holder's nor one of its descendants'", callerRefused: true };
    }
    if (holderExited) return { generation: current, active: false, why: "is held by an agent whose exit was confirmed" };
    if (lease?.cancelRequested) return { generation: current, active: false, why: "was asked to cancel" };
    if (lease?.ownershipConflict) return { generation: current, active: false, why: "has an unresolved ownership conflict" };
    if (!lease?.expiresAt) return { generation: current, active: false, why: "has no expiry" }; // not an answer the coordinator gives
    return { generation: current, active: true, untilMs: dateOf(lease.expiresAt).getTime() };
  };
}

/** Options for a {@link Fence}. */
export interface FenceOptions {
  /**
   * Asked about the job before a side effect is admitted: the fence then
   * admits only the job's current generation while it may act, and raises
   * its highest generation to the coordinator's. Without it, anyone who can
   * reach the tool server can send a generation nobody holds and fence the
   * job's real holder out, and a holder whose job was cancelled, expired or
   * ended keeps writing until a later generation is seen. A tool server
   * reachable by callers it does not trust sets it, e.g.
   * issuedGenerations(its own conn).
   */
  check?: GenerationCheck;
  /**
   * How long (ms) an answer that a generation may act admits its side
   * effects without asking, from when the fence asked, and never past the
   * expiry the coordinator stated: the coordinator's cancel, expiry or
   * resolution takes effect at the fence within it. 0 (the default) asks
   * for every side effect.
   */
  maxStaleMs?: number;
  /** Reads the time for maxStaleMs (ms since the epoch). Default Date.now. */
  clock?: Clock;
}

interface FenceJob {
  highest: bigint;
  active: bigint; // the generation an answer said may act, until untilMs
  untilMs: number;
  caller: string; // the node of the gate call the answer that active may act was given for
}

/**
 * Fence refuses side effects from superseded lease generations. Equal
 * generations pass (one holder's calls are not ordered against each
 * other). It remembers generations in memory: a tool server that must
 * fence across its own restarts stores the highest generation beside the
 * side effect and seeds the fence with {@link Fence.observe}. With a
 * check it also refuses a generation that was not issued
 * ({@link UnissuedGeneration}) or may not act now ({@link NoAuthority}),
 * as the Go SDK's agentsdk.Fence; answers that refuse are never kept.
 * Inside a {@link ToolGate} call it asks about a superseded generation too
 * (refusing it all the same), so the control plane keeps a former holder's
 * side effect after its exit on it; outside one it refuses it on its own.
 */
export class Fence {
  readonly #check?: GenerationCheck;
  readonly #maxStaleMs: number;
  readonly #clock: Clock;
  #jobs = new Map<string, FenceJob>();

  constructor(options: FenceOptions = {}) {
    this.#check = options.check;
    this.#maxStaleMs = options.maxStaleMs ?? 0;
    if (!(this.#maxStaleMs >= 0)) throw new RangeError("tether: fence: maxStaleMs must not be negative");
    this.#clock = options.clock ?? { now: Date.now };
  }

  /**
   * Admits a side effect for job under generation, raising the job's
   * highest generation to it; throws {@link Fenced} when a newer one was
   * seen, and with a check {@link UnissuedGeneration} or
   * {@link NoAuthority} when the coordinator refused it (nothing is
   * admitted then), or the check's error when it could not be asked.
   */
  async admit(job: string, generation: bigint): Promise<void> {
    if (typeof job !== "string" || job === "" || !validGeneration(generation)) {
      throw new RangeError("tether: fence: a side effect needs a job id and a lease generation (a positive integer)");
    }
    const problem = jobIdProblem(job);
    // Neither asked about nor remembered: such a job has no lease, and a
    // caller naming it must not spend the fence's memory, nor a request to
    // the coordinator answered as if it were down.
    if (problem) throw new UnissuedGeneration(`tether: fence: ${problem}`);
    const askedAt = this.#maxStaleMs > 0 ? this.#clock.now() : 0;
    const caller = gateCallNode();
    const h = this.highest(job);
    if (generation < h) {
      // Refused all the same, but asked about inside a ToolGate call: the
      // read names the call, and the control plane keeps a side effect
      // under a superseded generation on the call's node when it held the
      // job (a former holder writing after its exit). An ungated fence
      // does not ask: its read names no caller, and anyone naming the job
      // and an old generation would frame its former holders.
      if (this.#check && gateCallId() !== "") {
        try {
          this.observe(job, (await this.#check(job, generation)).generation);
        } catch {
          // The fence's own knowledge refuses it.
        }
      }
      throw fenced(job, generation, h);
    }
    const e = this.#jobs.get(job);
    if (!this.#check || (this.#maxStaleMs > 0 && e?.active === generation && e.caller === caller && askedAt < e.untilMs)) {
      this.observe(job, generation);
      return;
    }
    const a = await this.#check(job, generation);
    this.observe(job, a.generation); // issued: older generations are superseded
    const now = this.highest(job);
    if (generation < now) throw fenced(job, generation, now);
    if (generation > a.generation) {
      throw new UnissuedGeneration(`tether: fence: job ${JSON.stringify(job)} generation ${generation} is above the coordinator's, ${a.generation}`);
    }
    const entry = this.#jobs.get(job)!;
    if (!a.active) {
      if (entry.active === generation && !a.callerRefused) {
        entry.active = 0n;
        entry.untilMs = 0;
        entry.caller = "";
      }
      throw new NoAuthority(`tether: fence: job ${JSON.stringify(job)} generation ${generation} ${a.why ?? "may not act"}`);
    }
    if (this.#maxStaleMs > 0) {
      const until = Math.min(askedAt + this.#maxStaleMs, a.untilMs ?? 0);
      if (entry.active !== generation || entry.caller !== caller || until > entry.untilMs) {
        entry.active = generation;
        entry.untilMs = until;
        entry.caller = caller;
      }
    }
  }

  /**
   * {@link Fence.admit} for a request's headers (a fetch Headers, or node's
   * IncomingHttpHeaders): both are required, once each, the generation a
   * positive decimal integer; a request without them, or whose job id the
   * coordinator could not have issued ({@link MaxJobIdBytes}), throws a
   * RangeError before anything is asked.
   */
  admitHeaders(headers: Headers | Record<string, string | string[] | undefined>): Promise<void> {
    const get = (name: string): string | undefined => {
      if (headers instanceof Headers) return headers.get(name) ?? undefined;
      const v = headers[name.toLowerCase()] ?? headers[name];
      return Array.isArray(v) ? (v.length === 1 ? v[0] : undefined) : v;
    };
    const job = get(HeaderJobId);
    const raw = get(HeaderLeaseGeneration);
    if (!job || raw === undefined || !/^[1-9][0-9]{0,19}$/.test(raw) || BigInt(raw) > maxUint64) {
      return Promise.reject(new RangeError(`tether: fence: ${HeaderJobId} and ${HeaderLeaseGeneration} (a positive integer) are required, once each`));
    }
    const problem = jobIdProblem(job);
    if (problem) return Promise.reject(new RangeError(`tether: fence: ${HeaderJobId} is not a job the coordinator issues: ${problem}`));
    return this.admit(job, BigInt(raw));
  }

  /**
   * Raises the job's highest generation without admitting anything (seeding
   * from storage). Generation 0 raises nothing and remembers nothing; one
   * that is not a bigint in [0, 2^64) throws a RangeError.
   */
  observe(job: string, generation: bigint): void {
    if (generation === 0n) return;
    if (!validGeneration(generation)) throw new RangeError("tether: fence: a generation is an integer in [0, 2^64)");
    const e = this.#jobs.get(job);
    if (!e) this.#jobs.set(job, { highest: generation, active: 0n, untilMs: 0, caller: "" });
    else if (generation > e.highest) e.highest = generation;
  }

  /** The highest generation seen for job (0 if none). */
  highest(job: string): bigint {
    return this.#jobs.get(job)?.highest ?? 0n;
  }
}

function fenced(job: string, generation: bigint, highest: bigint): Fenced {
  return new Fenced(`tether: fenced: job ${JSON.stringify(job)} generation ${generation} is older than generation ${highest}`);
}
