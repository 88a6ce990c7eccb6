import { createHash } from "node:crypto";

/** A token's SHA-256 (base64), the key of its entry: no token is kept. */
export function digest(token: string): string {
  return createHash("sha256").update(token).digest("base64");
}

interface Entry<V> {
  holder: string;
  group: string;
  expiresAt: number;
  value: V;
}

/**
 * What the verification of a token proved, keyed by the token's digest,
 * bounded in all and per holder: the bookkeeping of the Go SDK's and the
 * control plane's caches (internal/tokencache), with the same rule.
 *
 * One holder keeps at most perHolder entries, its oldest going first. When
 * the cache is full, a token of a group (a lineage: a root grant and all
 * delegated under it) holding groupShare entries or more replaces its
 * group's oldest; any other makes room: expired entries go first, then
 * the oldest of the groups holding more than their share (down to it),
 * then the oldest of the largest groups (down to a common level), then
 * arbitrary ones, until a quarter of it is free. So a rogue whose children
 * each present their tokens keeps at most its share before it pushes out
 * only its own.
 */
export class TokenCache<V> {
  readonly #entries = new Map<string, Entry<V>>();
  /** Each holder's entries, oldest first, at most perHolder. */
  readonly #held = new Map<string, string[]>();
  /** Each group's entries, oldest first (a Set keeps its insertion order). */
  readonly #groups = new Map<string, Set<string>>();

  constructor(
    readonly max: number,
    readonly perHolder: number,
    readonly groupShare: number,
  ) {}

  get size(): number {
    return this.#entries.size;
  }

  get(sum: string): V | undefined {
    return this.#entries.get(sum)?.value;
  }

  /** How many entries holder holds. */
  held(holder: string): number {
    return this.#held.get(holder)?.length ?? 0;
  }

  /** How many entries group holds. */
  inGroup(group: string): number {
    return this.#groups.get(group)?.size ?? 0;
  }

  /** Keeps value for sum, held by holder, of group; expiresAt is when it may go first to make room. */
  put(sum: string, holder: string, group: string, expiresAt: number, now: number, value: V): void {
    this.remove(sum);
    const held = this.#held.get(holder);
    if (held && held.length >= this.perHolder) this.remove(held[0]);
    if (this.#entries.size >= this.max) {
      if (this.groupShare > 0 && this.inGroup(group) >= this.groupShare) this.remove(this.#oldest(group)!);
      else this.#evict(now);
    }
    this.#entries.set(sum, { holder, group, expiresAt, value });
    this.#held.set(holder, [...(this.#held.get(holder) ?? []), sum]);
    let g = this.#groups.get(group);
    if (!g) this.#groups.set(group, (g = new Set()));
    g.add(sum);
  }

  /** Forgets sum. */
  remove(sum: string): void {
    const e = this.#entries.get(sum);
    if (!e) return;
    this.#entries.delete(sum);
    const held = (this.#held.get(e.holder) ?? []).filter((s) => s !== sum);
    if (held.length === 0) this.#held.delete(e.holder);
    else this.#held.set(e.holder, held);
    const g = this.#groups.get(e.group);
    g?.delete(sum);
    if (g?.size === 0) this.#groups.delete(e.group);
  }

  /** Removes every entry expired at now. */
  expire(now: number): void {
    for (const [sum, e] of this.#entries) if (now >= e.expiresAt) this.remove(sum);
  }

  #oldest(group: string): string | undefined {
    const g = this.#groups.get(group);
    return g?.values().next().value;
  }

  /**
   * Makes room: expired entries first, then the oldest of the groups
   * holding more than their share, down to it, then the largest groups'
   * oldest (level), then arbitrary ones, until a quarter is free.
   */
  #evict(now: number): void {
    this.expire(now);
    const keep = Math.floor((this.max * 3) / 4);
    if (this.groupShare > 0) {
      for (const group of [...this.#groups.keys()]) {
        while (this.inGroup(group) > this.groupShare && this.#entries.size > keep) this.remove(this.#oldest(group)!);
      }
    }
    this.#level(this.#entries.size - keep);
    for (const sum of this.#entries.keys()) {
      if (this.#entries.size <= keep) return;
      this.remove(sum);
    }
  }

  /**
   * Removes up to n entries of the groups, the largest groups' first, each
   * group's oldest first: the groups are cut down to a common level (the
   * highest that frees n), the ones at it losing one more in turn until n
   * are gone.
   */
  #level(n: number): void {
    if (n <= 0 || this.#groups.size === 0) return;
    // Largest first; ties by name, so that the cut is the same whatever
    // the map's order.
    const groups = [...this.#groups].map(([name, g]) => ({ name, size: g.size }));
    groups.sort((a, b) => b.size - a.size || (a.name < b.name ? -1 : 1));
    n = Math.min(n, this.#entries.size);
    let freed = 0;
    let above = 0;
    let level = groups[0].size;
    while (freed < n) {
      while (above < groups.length && groups[above].size >= level) above++;
      if (freed + above >= n) break;
      freed += above;
      level--;
    }
    for (const g of groups) {
      if (g.size <= level) break;
      while (this.inGroup(g.name) > level) {
        this.remove(this.#oldest(g.name)!);
        n--;
      }
    }
    for (const g of groups.slice(0, above)) {
      if (n <= 0) return;
      if (this.inGroup(g.name) > 0) {
        this.remove(this.#oldest(g.name)!);
        n--;
      }
    }
  }
}
