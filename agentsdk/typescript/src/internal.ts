// Small helpers shared by the SDK's classes. Not exported from the package.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

/**
 * An unbounded async queue: the request side of a bidirectional stream.
 * push() never blocks; end() finishes the iteration. Iterated once.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #wake?: () => void;
  #ended = false;

  push(item: T): void {
    if (this.#ended) return;
    this.#items.push(item);
    this.#wake?.();
  }

  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  // An async generator: Connect needs next, return and throw.
  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      for (;;) {
        if (this.#items.length > 0) {
          yield this.#items.shift() as T;
        } else if (this.#ended) {
          return;
        } else {
          await new Promise<void>((resolve) => (this.#wake = resolve));
          this.#wake = undefined;
        }
      }
    } finally {
      this.#ended = true;
    }
  }
}

/**
 * Whether err, a session's, a heartbeat's or a lease renewal's, is a
 * refusal of the agent itself that its run (and a lease job) ends on: the
 * credential is dead (unauthenticated, permission_denied) or the node's
 * exit was confirmed (failed_precondition) (the Go SDK's endsRun).
 */
export function endsRun(err: unknown): boolean {
  if (!(err instanceof ConnectError)) return false;
  return err.code === Code.Unauthenticated || err.code === Code.PermissionDenied || err.code === Code.FailedPrecondition;
}

/** Resolves after ms, or at once (without throwing) when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const onAbort = () => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A Date from an optional protobuf Timestamp (epoch when unset). */
export function dateOf(ts: Timestamp | undefined): Date {
  return ts ? timestampDate(ts) : new Date(0);
}

/** A Duration init from milliseconds (whole nanoseconds). */
export function durationFromMs(ms: number): { seconds: bigint; nanos: number } {
  const seconds = Math.floor(ms / 1000);
  return { seconds: BigInt(seconds), nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

/** Milliseconds of an optional protobuf Duration. */
export function msOf(d: { seconds: bigint; nanos: number } | undefined): number {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}

/** An AbortSignal that aborts when any of signals does, with that signal's reason. */
export function anySignal(signals: (AbortSignal | undefined)[]): AbortSignal {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  if (present.length === 1) return present[0];
  return AbortSignal.any(present);
}

/**
 * A token's signature, the part after its last dot: a JWT's header and
 * claims are not secret, its signature makes a copy of it usable. "" when
 * the token has no dot or the part is too short to be told from ordinary
 * text. The one definition the bearer token's and the tool gate's
 * redaction share (the Go and Python SDKs' too).
 */
export function tokenSignature(token: string): string {
  const i = token.lastIndexOf(".");
  return i < 0 || token.length - i - 1 < 16 ? "" : token.slice(i + 1);
}

/** text without token, nor its signature, naming what was cut ("[what]", "[what signature]"). */
export function withoutSecret(text: string, token: string, what: string): string {
  if (typeof token !== "string" || token === "") return text;
  text = text.replaceAll(token, `[${what}]`);
  const signature = tokenSignature(token);
  return signature === "" ? text : text.replaceAll(signature, `[${what} signature]`);
}

/**
 * A thrown value as text: an Error's message, or the value itself as text,
 * and none when it has no text. Never throws: a tool that rethrows its
 * input (or an upstream's answer to it) as it came throws what a rogue
 * caller chose, a value String() throws on ({"toString": 1}) or an error
 * whose message is no text, and a tool gate that threw on describing it
 * never reported the call's end (rogue40G test: the call in flight for
 * good, the agent's drain held to its deadline, the gate's cancel then
 * recorded unacknowledged), as the Go gate records a handler that panicked
 * failed.
 */
export function textOf(err: unknown, none: string): string {
  try {
    const message: unknown = err instanceof Error ? err.message : err;
    return typeof message === "string" ? message : String(message);
  } catch {
    return none;
  }
}

/**
 * Tests only: a verifier's function called after it applies each
 * revocation feed message, and waited for before the next is read, to
 * check what it accepts between two messages of one answer. Not exported
 * from the package.
 */
export const feedHooks = new WeakMap<object, (msg: import("./gen/tether/v1/capability_pb.js").WatchRevocationsResponse) => Promise<void>>();

/**
 * Tests only: an agent's function called in its run once its credential
 * (or its session) was refused and the abort noted, before run waits for
 * the onAbort callbacks still running. Not exported from the package.
 */
export const abortWaitHooks = new WeakMap<object, () => void>();

const inspectCustom = Symbol.for("nodejs.util.inspect.custom");

/**
 * obj, which util.inspect (console.log) prints with its secret field shown
 * as "[not shown]": a framework logging a spawned child or a grant showed
 * its credential or token to whoever reads the logs. JSON.stringify,
 * asked for on purpose (a child handed to its process), still carries it.
 */
export function printedWithout<T extends object>(obj: T, field: keyof T): T {
  Object.defineProperty(obj, inspectCustom, {
    enumerable: false,
    value(_depth: number, options: object, inspect: (value: unknown, options: object) => string) {
      return inspect({ ...obj, [field]: "[not shown]" }, options);
    },
  });
  return obj;
}
