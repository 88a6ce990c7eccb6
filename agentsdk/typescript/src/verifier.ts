import type { KeyObject } from "node:crypto";

import { allows, parseJwks, TokenError, verifyToken, DefaultLeewayMs, type Claims } from "./capability.js";
import { Conn } from "./conn.js";
import type { WatchRevocationsResponse } from "./gen/tether/v1/capability_pb.js";
import { dateOf, feedHooks, sleep, withoutSecret } from "./internal.js";
import { digest, TokenCache } from "./tokencache.js";

/** Where the control plane publishes its public keys. */
export const JwksPath = "/.well-known/jwks.json";
const maxJwksBytes = 1 << 20;

export const DefaultStalenessBudgetMs = 10_000;
export const DefaultJwksMinIntervalMs = 10_000;
const jwksRefreshEveryMs = 5 * 60_000;
const maintenanceEveryMs = 30_000;
const maxBackoffMs = 5_000;

/**
 * Bounds the verified tokens a Verifier caches of one holder node (a
 * token's sub), its next replacing its oldest: a node uses one token per
 * grant it holds, refreshed every few minutes. A rogue minting itself a
 * distinct token every second and presenting each once filled the whole
 * cache with its own, and every other caller's token paid its signature
 * check on every call. The Go verifier holds as many.
 */
export const MaxCachedTokensPerHolder = 4;

/**
 * Bounds the claims a Verifier caches of one token (the characters of its
 * ids, chain and scopes): a token carrying more is verified, signature and
 * all, at each call, and never cached. An agent's token of a few scopes
 * carries a few hundred; a rogue's grant of 32 scopes of 128 bytes,
 * delegated to each of its children, carries 4 KiB. The Go verifier's
 * MaxCachedClaimBytes.
 */
export const MaxCachedClaimBytes = 2 << 10;

/**
 * The verified tokens a Verifier caches by default: at most
 * MaxCachedClaimBytes of claims each and no token (its digest). It was
 * 65,536 entries, each keeping the token and its claims of any size (the
 * Go verifier's default, rogue40M test).
 */
export const DefaultCacheSize = 1 << 14;

/** Tells a Verifier the time in ms since the epoch. Tests inject a manual clock. */
export interface Clock {
  now(): number;
}

/** Options for a {@link Verifier}. */
export interface VerifierOptions {
  /**
   * Reaches the control plane: the key set is fetched from
   * conn.baseUrl + JwksPath, and the revocation feed is followed with
   * conn's bearer token (any reader: a viewer token or an agent credential).
   * An agent credential follows only its own tree's revocations (the feed
   * names it): a token of another tree, or of none, is refused
   * ("tree_not_followed"), since its revocation would never be heard. A
   * tool other trees' agents reach verifies with a viewer's or tool
   * server's token, which follows the whole feed.
   */
  conn: Conn;
  /** The expected iss; default "tether". */
  issuer?: string;
  /** Clock skew allowed on exp, nbf and iat; default 5 s, at most 30 s. */
  leewayMs?: number;
  /**
   * How old the revocation feed may be before every verification fails
   * closed ("feed_stale"); default 10 s. Keep it several times the control
   * plane's heartbeat (two seconds by default).
   */
  stalenessBudgetMs?: number;
  /**
   * Bounds the verified tokens kept (until they expire) so that their
   * signatures are not checked again; default DefaultCacheSize, 0 to
   * disable. An entry keeps the token's SHA-256 and its claims (at most
   * MaxCachedClaimBytes), at most MaxCachedTokensPerHolder of one holder's;
   * once the cache is full, a token of a lineage (its root grant and all
   * delegated under it) holding an eighth of it or more replaces its
   * lineage's oldest, and any other's makes room, expired entries and the
   * largest lineages' oldest first (the Go verifier's rule): a rogue whose
   * children each present their tokens keeps at most its share.
   */
  cacheSize?: number;
  /** The least time between two key-set fetches caused by unknown kids; default 10 s. */
  jwksMinIntervalMs?: number;
  /**
   * Tokens' times are checked on it (default Date.now); so is the feed's
   * age when it is given (its forward steps added up: a step back does
   * not make the feed younger), else on a monotonic clock
   * (performance.now). A clock that goes back past the feed's last
   * message fails closed.
   */
  clock?: Clock;
  /** Where warnings go (never a token); default: nowhere. */
  warn?: (message: string) => void;
}

interface Tombstone {
  sequence: bigint;
  grantId: string;
  revokedAtMs: number;
  dropAfterMs: number;
}

/**
 * Verifier checks capability tokens for a resource server or tool gate
 * offline: the Ed25519 signature against the control plane's JWKS, the
 * claims with pinned options, and revocation against an in-memory
 * tombstone set that follows the control plane's revocation feed
 * (CapabilityService.WatchRevocations).
 *
 * Every call:
 *  1. fails closed ("feed_stale") when the feed was last heard from longer
 *     than the staleness budget ago, or never, before the token is looked
 *     at and again after (a key-set fetch may have taken its time);
 *  2. verifies the token, or finds it in the cache of tokens already
 *     verified (the cache skips only the signature and claim parsing);
 *  3. rejects a token past its exp, and one whose jti or any chain entry
 *     is tombstoned ("grant_revoked");
 *  4. when the feed follows one tree only (an agent's credential), rejects
 *     a token whose root claim names another tree, or none
 *     ("tree_not_followed").
 *
 * {@link Verifier.run} must be running for the feed to be followed; until
 * its first message arrives every call fails closed.
 */
export class Verifier {
  readonly #conn: Conn;
  readonly #issuer: string;
  readonly #leeway: number;
  readonly #budget: number;
  readonly #jwksMinInterval: number;
  readonly #clock: Clock;
  readonly #warn: (message: string) => void;

  #keys = new Map<string, KeyObject>();
  #lastOnDemandFetch = -Infinity;
  #fetching?: Promise<void>;
  #tombstones = new Map<string, Tombstone>();
  #head = 0n;
  /** The root node id of the one tree the feed follows (its tree_root), "" for the whole feed. */
  #tree = "";
  #syncedAt?: number;
  /**
   * Where the feed's age is measured: a monotonic clock (performance.now)
   * unless a clock was injected. Date.now, which it was, steps back when
   * the host's clock is set back, and a feed that died kept the verifier
   * fresh for as long as the step. An injected clock's forward steps are
   * added up (#feedElapsed), a step back counted as no time: its now
   * minus the message's arrival lost every step back short of the
   * message. Time that passed before a step back with no reading in
   * between is not counted: only readings tell it.
   */
  readonly #feedClock: () => number;
  /** The injected clock's last reading, and its reading at the feed's last message. */
  #feedLast?: number;
  #feedSyncedRaw?: number;
  #feedElapsed = 0;
  /** The verified tokens' claims by the tokens' digests (undefined: no cache). */
  readonly #cache?: TokenCache<Claims>;
  #ready: Promise<void>;
  #markReady!: () => void;
  #waiters: { sequence: bigint; resolve: () => void }[] = [];
  /**
   * A snapshot that spans several feed messages (each but its last
   * continues), gathered until its last: the set is replaced only then, so
   * that no revocation of the old set is forgotten before the copy is
   * whole. Undefined when no snapshot is under way.
   */
  #snapshot?: Tombstone[];

  constructor(options: VerifierOptions) {
    this.#conn = options.conn;
    this.#issuer = options.issuer ?? "tether";
    this.#leeway = options.leewayMs ?? DefaultLeewayMs;
    this.#budget = options.stalenessBudgetMs && options.stalenessBudgetMs > 0 ? options.stalenessBudgetMs : DefaultStalenessBudgetMs;
    const cacheSize = options.cacheSize ?? DefaultCacheSize;
    if (cacheSize > 0) this.#cache = new TokenCache<Claims>(cacheSize, MaxCachedTokensPerHolder, Math.max(1, Math.floor(cacheSize / 8)));
    this.#jwksMinInterval = options.jwksMinIntervalMs && options.jwksMinIntervalMs > 0 ? options.jwksMinIntervalMs : DefaultJwksMinIntervalMs;
    this.#clock = options.clock ?? { now: Date.now };
    const injected = options.clock;
    this.#feedClock = injected
      ? () => {
          const raw = injected.now();
          if (this.#feedLast !== undefined && raw > this.#feedLast) this.#feedElapsed += raw - this.#feedLast;
          this.#feedLast = raw;
          return this.#feedElapsed;
        }
      : () => performance.now();
    // The peer writes the errors warned of (a key set's kid, a feed's
    // refusal), and could quote the token the feed was opened with.
    const warn = options.warn ?? (() => {});
    this.#warn = (message) => warn(withoutSecret(message, this.#conn.token, "bearer token"));
    this.#ready = new Promise((resolve) => (this.#markReady = resolve));
  }

  /** Resolves once the first feed message has been applied: from then on verify can succeed. */
  get ready(): Promise<void> {
    return this.#ready;
  }

  /**
   * The root node id of the one tree whose revocations the verifier
   * follows (its conn holds an agent's credential), or "" when it follows
   * the whole feed or has heard nothing yet.
   */
  get tree(): string {
    return this.#tree;
  }

  /** The last feed sequence applied. */
  get head(): bigint {
    return this.#head;
  }

  /** Resolves once the verifier has applied the feed up to sequence (e.g. RevokeResponse.sequence). */
  caughtUp(sequence: bigint): Promise<void> {
    if (this.#head >= sequence) return Promise.resolve();
    return new Promise((resolve) => this.#waiters.push({ sequence, resolve }));
  }

  /** Throws the error every verify would fail with while the feed is stale; returns otherwise. */
  checkFresh(): void {
    if (this.#syncedAt === undefined) throw new TokenError("feed_stale", "never synced");
    const age = this.#feedClock() - this.#syncedAt;
    if (age > this.#budget) throw new TokenError("feed_stale", `last synced ${age} ms ago, budget ${this.#budget} ms`);
    // A clock that went back past the feed's last message cannot say how
    // old the feed is: fail closed until it passes that point again.
    const behind = this.#feedSyncedRaw !== undefined && this.#feedLast !== undefined ? this.#feedSyncedRaw - this.#feedLast : 0;
    if (behind > 0) throw new TokenError("feed_stale", `the clock went back ${behind} ms past the feed's last message`);
  }

  /** Checks a token for use now and returns its claims, or throws a {@link TokenError}. */
  async verify(token: string): Promise<Claims> {
    this.checkFresh();
    const claims = await this.#claims(token, this.#clock.now());
    // Again where the tombstones are read: a check of an unknown kid waits
    // for the key set (up to its 10 s), and a feed that died meanwhile, the
    // budget passing, left a revocation unheard.
    this.checkFresh();
    const via = this.#revokedVia(claims);
    if (via === claims.grantId) throw new TokenError("grant_revoked", `grant ${claims.grantId} is revoked`);
    if (via) throw new TokenError("grant_revoked", `grant ${claims.grantId} is revoked via ancestor grant ${via}`);
    const tree = this.#tree;
    if (tree !== "" && claims.root !== tree) {
      const why =
        claims.root === ""
          ? `the token for grant ${claims.grantId} names no tree (minted before tokens named theirs; refresh it)`
          : `grant ${claims.grantId} is held in another tree, whose revocations it never hears of`;
      throw new TokenError(
        "tree_not_followed",
        `this verifier follows only tree ${tree}'s revocations (its connection holds an agent's credential), and ${why}; verify it with a verifier that follows every tree (a tool server's or a viewer's token)`,
      );
    }
    return claims;
  }

  /** verify plus the scope check a tool call needs ("scope_not_granted" otherwise). */
  async authorize(token: string, requiredScope: string): Promise<Claims> {
    const claims = await this.verify(token);
    if (!allows(claims.scopes, requiredScope)) {
      throw new TokenError("scope_not_granted", `grant ${claims.grantId} does not allow scope ${JSON.stringify(requiredScope)}`);
    }
    return claims;
  }

  #revokedVia(claims: Claims): string | undefined {
    for (const id of claims.chain) if (this.#tombstones.has(id)) return id;
    return this.#tombstones.has(claims.grantId) ? claims.grantId : undefined;
  }

  async #claims(token: string, now: number): Promise<Claims> {
    const sum = this.#cache ? digest(token) : "";
    const cached = this.#cache?.get(sum);
    if (cached) {
      if (now < cached.expiresAt.getTime()) return cached;
      this.#cache!.remove(sum);
      throw new TokenError("token_expired", `token for grant ${cached.grantId} expired at ${cached.expiresAt.toISOString()}`);
    }
    const options = { issuer: this.#issuer, leewayMs: this.#leeway };
    let claims: Claims;
    try {
      claims = verifyToken(token, (kid) => this.#keys.get(kid), now, options);
    } catch (err) {
      if (!(err instanceof TokenError) || err.kind !== "unknown_key") throw err;
      // A key rotated in since the last fetch, or a forged kid: refetch,
      // rate-limited, and try once more.
      await this.#refreshAfterMiss(now);
      claims = verifyToken(token, (kid) => this.#keys.get(kid), now, options);
    }
    if (this.#cache) this.#remember(sum, claims, now);
    return claims;
  }

  /**
   * Caches a verified token's claims under its digest, unless they pass
   * MaxCachedClaimBytes: at most MaxCachedTokensPerHolder of one holder's
   * (its next replaces its oldest), and, once the cache is full, a
   * lineage's share (TokenCache).
   */
  #remember(sum: string, claims: Claims, now: number): void {
    const cache = this.#cache!;
    if (claimBytes(claims) > MaxCachedClaimBytes || cache.get(sum)) return;
    cache.put(sum, claims.holderNodeId, claims.chain[0] ?? claims.grantId, claims.expiresAt.getTime(), now, claims);
  }

  /** How many verified tokens are cached, in all and of holder (for tests). */
  cached(holder?: string): number {
    if (!this.#cache) return 0;
    return holder === undefined ? this.#cache.size : this.#cache.held(holder);
  }

  async #refreshAfterMiss(now: number): Promise<void> {
    if (this.#fetching) return this.#fetching;
    if (now - this.#lastOnDemandFetch < this.#jwksMinInterval) return;
    this.#lastOnDemandFetch = now;
    try {
      await this.#fetchKeys();
    } catch (err) {
      this.#warn(`tether: refreshing the key set failed: ${(err as Error).message}`);
    }
  }

  #fetchKeys(): Promise<void> {
    this.#fetching ??= (async () => {
      // A redirect is not followed: the key set would come from wherever
      // the peer's Location said.
      const resp = await fetch(this.#conn.baseUrl + JwksPath, { signal: AbortSignal.timeout(10_000), redirect: "manual" });
      if (resp.status >= 300 && resp.status < 400) {
        await resp.body?.cancel();
        throw new Error(`tether: fetch jwks: the control plane answered with a redirect (HTTP ${resp.status}), which is not followed: configure the address it redirects to, if that is the control plane`);
      }
      if (resp.status !== 200) throw new Error(`tether: fetch jwks: HTTP ${resp.status}`);
      const body = await readAtMost(resp, maxJwksBytes);
      this.#keys = parseJwks(JSON.parse(body.toString("utf8")));
    })().finally(() => (this.#fetching = undefined));
    return this.#fetching;
  }

  /**
   * Follows the revocation feed and keeps the key set until signal aborts,
   * reconnecting after a failure (with backoff) after the last sequence
   * applied; a snapshot answer replaces the tombstone set once its last
   * message (one that does not continue) has arrived, the old set kept
   * (with the copy's tombstones added) until then. A stream silent
   * for the staleness budget is dropped and reopened.
   */
  async run(signal?: AbortSignal): Promise<void> {
    try {
      await this.#fetchKeys();
    } catch (err) {
      this.#warn(`tether: fetching the key set failed; will retry: ${(err as Error).message}`);
    }
    const maintenance = setInterval(() => this.#maintain(), maintenanceEveryMs);
    let lastJwks = this.#clock.now();
    const refreshKeys = setInterval(() => {
      if (this.#clock.now() - lastJwks < jwksRefreshEveryMs) return;
      lastJwks = this.#clock.now();
      this.#fetchKeys().catch((err) => this.#warn(`tether: refreshing the key set failed: ${(err as Error).message}`));
    }, maintenanceEveryMs);
    maintenance.unref();
    refreshKeys.unref();
    let backoff = 50;
    try {
      while (!signal?.aborted) {
        let applied = 0;
        try {
          applied = await this.#follow(signal);
        } catch (err) {
          if (signal?.aborted) break;
          this.#warn(`tether: revocation feed interrupted; reconnecting: ${(err as Error).message}`);
        }
        if (applied > 0) backoff = 50;
        await sleep(backoff, signal);
        backoff = Math.min(2 * backoff, maxBackoffMs);
      }
    } finally {
      clearInterval(maintenance);
      clearInterval(refreshKeys);
    }
  }

  async #follow(outer?: AbortSignal): Promise<number> {
    const local = new AbortController();
    const stop = () => local.abort();
    outer?.addEventListener("abort", stop, { once: true });
    // A stream silent past the budget is dead or stalled; the verifier is
    // failing closed by then, and a new stream may do better.
    let watchdog = setTimeout(stop, this.#budget);
    let applied = 0;
    // A snapshot cut off by the last stream's end is not finished by this
    // one: it resumes from the old position and starts its own.
    this.#snapshot = undefined;
    try {
      const stream = this.#conn.capability.watchRevocations({ afterSequence: this.#head }, { signal: local.signal });
      for await (const msg of stream) {
        clearTimeout(watchdog);
        watchdog = setTimeout(stop, this.#budget);
        this.#apply(msg);
        applied++;
        const hook = feedHooks.get(this);
        if (hook) await hook(msg);
      }
      throw new Error("the control plane closed the revocation feed");
    } finally {
      clearTimeout(watchdog);
      outer?.removeEventListener("abort", stop);
      local.abort();
    }
  }

  #apply(msg: WatchRevocationsResponse): void {
    const tombstones: Tombstone[] = msg.tombstones.map((t) => ({
      sequence: t.sequence,
      grantId: t.grantId,
      revokedAtMs: dateOf(t.revokedAt).getTime(),
      dropAfterMs: dateOf(t.dropAfter).getTime(),
    }));
    if (tombstones.some((t) => t.grantId === "")) throw new Error("a tombstone without a grant id");
    // The tree the feed follows, before the message marks it fresh.
    this.#tree = msg.treeRoot;
    // A new copy starts with a snapshot's first message (one cut off by
    // a broken stream was dropped with it).
    if (msg.snapshot) this.#snapshot = [];
    if (this.#snapshot && !msg.continues) {
      // The snapshot's last message: the set becomes the copy, whole.
      const whole = [...this.#snapshot, ...tombstones];
      this.#snapshot = undefined;
      this.#tombstones = new Map();
      this.#head = msg.headSequence;
      this.#add(whole);
    } else {
      // A snapshot that continues in the next message leaves the old set
      // whole until then (one replaced with its first message forgot,
      // until its last, every revocation the copy sent later), which
      // gains the copy's tombstones so far: revocation only narrows.
      this.#snapshot?.push(...tombstones);
      this.#add(tombstones);
    }
    // A message cut short is not the feed's head: the verifier is neither
    // ready nor fresh again until the message that reaches it.
    if (!msg.continues) {
      if (msg.headSequence > this.#head) this.#head = msg.headSequence;
      // Freshness is measured on this verifier's clock, when the message
      // arrived, not by the server's time in it.
      this.#syncedAt = this.#feedClock();
      this.#feedSyncedRaw = this.#feedLast;
      this.#markReady();
      this.#waiters = this.#waiters.filter((w) => {
        if (w.sequence > this.#head) return true;
        w.resolve();
        return false;
      });
    }
  }

  #add(tombstones: Tombstone[]): void {
    for (const t of tombstones) {
      const existing = this.#tombstones.get(t.grantId);
      if (existing) {
        existing.dropAfterMs = Math.max(existing.dropAfterMs, t.dropAfterMs);
      } else {
        this.#tombstones.set(t.grantId, { ...t });
      }
      if (t.sequence > this.#head) this.#head = t.sequence;
    }
  }


  #maintain(): void {
    const now = this.#clock.now();
    for (const [id, t] of this.#tombstones) if (now > t.dropAfterMs) this.#tombstones.delete(id);
    this.#cache?.expire(now);
  }
}

/** What the strings of c hold: what a cache entry keeps of the token. */
function claimBytes(c: Claims): number {
  let n = c.grantId.length + c.holderNodeId.length + c.root.length + c.keyId.length;
  for (const s of c.chain) n += s.length;
  for (const s of c.scopes) n += s.length;
  return n;
}

/**
 * The body of resp, refused once it passes limit bytes: reading it whole
 * first would hold as much as the peer sends, for as long as it sends.
 */
async function readAtMost(resp: Response, limit: number): Promise<Buffer> {
  const tooLarge = () => new Error("tether: fetch jwks: key set larger than 1 MiB");
  if (Number(resp.headers.get("content-length") ?? 0) > limit) {
    await resp.body?.cancel();
    throw tooLarge();
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = resp.body?.getReader();
  if (!reader) return Buffer.alloc(0);
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return Buffer.concat(chunks);
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel();
      throw tooLarge();
    }
    chunks.push(value);
  }
}
