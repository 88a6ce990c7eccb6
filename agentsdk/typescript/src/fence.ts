// The tool server's half of lease fencing, as the Go SDK's agentsdk.Fence:
// a side effect carries the job id and the lease generation its caller
// holds (a LeaseWorker Job's headers()), and the fence refuses one whose
// generation is lower than the highest it has seen for that job.
import { Code, ConnectError } from "@connectrpc/connect";

import type { Conn } from "./conn.js";

/** Headers a {@link Fence} reads: the job and the lease generation the caller holds. */
export const HeaderJobId = "Tether-Job-Id";
export const HeaderLeaseGeneration = "Tether-Lease-Generation";

const maxUint64 = (1n << 64n) - 1n;

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

/** Confirms that generation was issued for job (the job's current one or earlier), or throws. */
export type GenerationCheck = (job: string, generation: bigint) => Promise<void>;

/**
 * The {@link GenerationCheck} that asks the control plane
 * (LeaseService.GetLease, which a tool server's token may call): a
 * generation above the lease's, and a job it does not know, are
 * {@link UnissuedGeneration}.
 */
export function issuedGenerations(conn: Conn): GenerationCheck {
  return async (job, generation) => {
    let current: bigint;
    try {
      current = (await conn.lease.getLease({ jobId: job })).lease?.leaseGeneration ?? 0n;
    } catch (err) {
      if (ConnectError.from(err).code === Code.NotFound) throw new UnissuedGeneration(`tether: fence: job ${JSON.stringify(job)} has no lease`);
      throw new Error(`tether: fence: asking the coordinator for job ${JSON.stringify(job)}'s generation: ${ConnectError.from(err).rawMessage}`);
    }
    if (generation > current) {
      throw new UnissuedGeneration(`tether: fence: job ${JSON.stringify(job)} generation ${generation} is above the coordinator's, ${current}`);
    }
  };
}

/** Options for a {@link Fence}. */
export interface FenceOptions {
  /**
   * Confirms a generation above the highest seen before the fence raises
   * to it (once per generation, not per call); without it, anyone who can
   * reach the tool server can send a generation nobody holds and fence the
   * job's real holder out. A tool server reachable by callers it does not
   * trust sets it, e.g. issuedGenerations(its own conn).
   */
  check?: GenerationCheck;
}

/**
 * Fence refuses side effects from superseded lease generations. Equal
 * generations pass (one holder's calls are not ordered against each
 * other). It remembers generations in memory: a tool server that must
 * fence across its own restarts stores the highest generation beside the
 * side effect and seeds the fence with {@link Fence.observe}.
 */
export class Fence {
  readonly #check?: GenerationCheck;
  #highest = new Map<string, bigint>();

  constructor(options: FenceOptions = {}) {
    this.#check = options.check;
  }

  /**
   * Admits a side effect for job under generation, raising the job's
   * highest generation to it; throws {@link Fenced} when a newer one was
   * seen, {@link UnissuedGeneration} when the check refused it (nothing is
   * raised then), or the check's error when the coordinator could not be asked.
   */
  async admit(job: string, generation: bigint): Promise<void> {
    if (typeof job !== "string" || job === "" || typeof generation !== "bigint" || generation <= 0n || generation > maxUint64) {
      throw new RangeError("tether: fence: a side effect needs a job id and a lease generation (a positive integer)");
    }
    const h = this.highest(job);
    if (generation < h) throw fenced(job, generation, h);
    if (generation === h || !this.#check) {
      this.observe(job, generation);
      return;
    }
    await this.#check(job, generation);
    const now = this.highest(job); // raised meanwhile?
    if (generation < now) throw fenced(job, generation, now);
    this.observe(job, generation);
  }

  /**
   * {@link Fence.admit} for a request's headers (a fetch Headers, or node's
   * IncomingHttpHeaders): both are required, the generation a positive
   * decimal integer; a request without them throws a RangeError.
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
      return Promise.reject(new RangeError(`tether: fence: ${HeaderJobId} and ${HeaderLeaseGeneration} (a positive integer) are required`));
    }
    return this.admit(job, BigInt(raw));
  }

  /** Raises the job's highest generation without admitting anything (seeding from storage). */
  observe(job: string, generation: bigint): void {
    if (generation > this.highest(job)) this.#highest.set(job, generation);
  }

  /** The highest generation seen for job (0 if none). */
  highest(job: string): bigint {
    return this.#highest.get(job) ?? 0n;
  }
}

function fenced(job: string, generation: bigint, highest: bigint): Fenced {
  return new Fenced(`tether: fenced: job ${JSON.stringify(job)} generation ${generation} is older than generation ${highest}`);
}
