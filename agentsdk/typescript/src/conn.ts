import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { AgentService } from "./gen/tether/v1/agent_pb.js";
import { AuthService } from "./gen/tether/v1/auth_pb.js";
import { CapabilityService } from "./gen/tether/v1/capability_pb.js";
import { LeaseService } from "./gen/tether/v1/lease_pb.js";
import { SupervisorService } from "./gen/tether/v1/supervisor_pb.js";
import { ToolService } from "./gen/tether/v1/tool_pb.js";
import { tokenSignature, withoutSecret } from "./internal.js";

// A bearer token is printable ASCII without spaces (a JWT is base64url and
// dots).
const bareToken = /^[!-~]*$/;

/**
 * The largest message a connection reads from the control plane, as it
 * comes or once it inflates (the Python SDK's bound): connect's own default
 * is 4 GiB, which a peer gone wrong (a proxy's, or a hostile one's answer)
 * could fill the process's memory with.
 */
export const MaxMessageBytes = 16 << 20;

/**
 * A unary call's deadline unless its connection or the call says otherwise
 * (the Python SDK's default): a control plane that never answers, or
 * trickles its answer, holds no call for longer.
 */
export const DefaultTimeoutMs = 30_000;

/** Options for {@link Conn.dial}. */
export interface DialOptions {
  /**
   * A transport to use instead of the default HTTP/2 one (for TLS options,
   * interceptors of your own, or a shared session). It must add no
   * Authorization header: the connection adds its own bearer token. Give
   * it readMaxBytes: {@link MaxMessageBytes} to keep the default's bound.
   */
  transport?: (authInterceptor: Interceptor) => Transport;
  /**
   * Every unary call's deadline, unless the call gives its own timeoutMs;
   * default {@link DefaultTimeoutMs}, 0 for none. Streams (an agent's
   * session, a gate's cancel orders, a verifier's revocation feed) carry
   * none: they are meant to stay open.
   */
  timeoutMs?: number;
  /**
   * How a unary call refused `resource_exhausted` with a retry hint is
   * sent again ({@link RetryOptions}; default {@link DefaultRetry}; `{
   * attempts: 1 }`: never).
   */
  retry?: RetryOptions;
}

/**
 * How a connection retries a unary call the control plane refused
 * `resource_exhausted` with a retry hint: a rate limit's refusal (its
 * Retry-After header, in whole seconds), which the control plane answers
 * before the call does anything, so that sending it again is safe. A
 * refusal without a hint (a bound that time alone does not lift: too many
 * open streams or connections, a node's grants) is not retried, nor is a
 * stream. The call waits the hint, stretched by up to half again at random
 * so that callers refused together (a host's agents reconnecting at once)
 * do not all come back at the same instant, then is sent again, at most
 * `attempts` times in all, within the call's deadline; a hint longer than
 * `maxWaitMs`, or one that would end past the deadline, is not waited for
 * (the Go and Python SDKs' rule).
 */
export interface RetryOptions {
  /** The most times a call is sent; 1 (or less): no retry. */
  attempts?: number;
  /** The longest wait before a retry. */
  maxWaitMs?: number;
  /** Waits ms, rejecting when signal aborts (tests inject it). */
  wait?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** A number in [0, 1) (default Math.random). */
  jitter?: () => number;
  /** The time in milliseconds the deadline is judged by (default Date.now). */
  now?: () => number;
}

/**
 * The longest retry hint {@link Agent.run} waits before reconnecting a
 * session the control plane refused with one (the Go SDK's
 * MaxReconnectHint).
 */
export const MaxReconnectHintMs = 60_000;

/** A connection's retry unless its options say otherwise (the Go and Python SDKs' default). */
export const DefaultRetry: Readonly<Required<Pick<RetryOptions, "attempts" | "maxWaitMs">>> = { attempts: 4, maxWaitMs: 10_000 };

/**
 * The wait, in milliseconds, a `resource_exhausted` refusal asks for
 * before the call is sent again (its Retry-After header), or undefined
 * when err is no such refusal or carries no hint.
 */
export function retryHintMs(err: unknown): number | undefined {
  if (!(err instanceof ConnectError) || err.code !== Code.ResourceExhausted) return undefined;
  const v = err.metadata.get("retry-after")?.trim();
  if (v === undefined || !/^[0-9]{1,6}$/.test(v)) return undefined;
  const seconds = Number(v);
  return seconds <= 86_400 ? seconds * 1000 : undefined;
}

/**
 * A connection to the control plane presenting one bearer token: an
 * operator token, a tool-server token, or an agent credential. The token can
 * be replaced (credential refresh) while calls are in flight; every call
 * reads the current one.
 *
 * The transport is Connect over HTTP/2 (`h2c` for http:// URLs, TLS for
 * https://): the agent's session is a bidirectional stream.
 *
 * A call's error carries neither the token it sent nor its signature: a
 * peer that echoes the request it refused (a proxy, or a hostile control
 * plane) would otherwise put a usable copy of the credential in the
 * error's message, metadata or details, and from there in the caller's
 * logs.
 */
export class Conn {
  readonly baseUrl: string;
  readonly transport: Transport;
  readonly auth: Client<typeof AuthService>;
  readonly agent: Client<typeof AgentService>;
  readonly capability: Client<typeof CapabilityService>;
  readonly tool: Client<typeof ToolService>;
  readonly supervisor: Client<typeof SupervisorService>;
  readonly lease: Client<typeof LeaseService>;
  /** A unary call's deadline unless the call gives its own ({@link DialOptions.timeoutMs}; 0: none). */
  readonly timeoutMs: number;
  /**
   * How the connection retries ({@link DialOptions.retry}); its wait and
   * jitter are also how {@link Agent.run} waits before it reconnects.
   */
  readonly retry: Readonly<RetryOptions>;

  #token: string;
  #sessions?: Http2SessionManager;

  private constructor(baseUrl: string, token: string, options: DialOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#token = token;
    const bearer: Interceptor = (next) => async (req) => {
      const token = this.#token;
      // Headers would refuse it with the whole value (the token) in its
      // error: refuse it here, unquoted, as the Go and Python SDKs do.
      if (!bareToken.test(token)) {
        throw new ConnectError(
          "the bearer token holds a space, line break or other character a header cannot carry (trim a token read from a file); it was not sent",
          Code.Unauthenticated,
        );
      }
      req.header.set("Authorization", `Bearer ${token}`);
      try {
        const res = await next(req);
        return res.stream ? { ...res, message: messagesWithoutBearer(res.message, token) } : res;
      } catch (err) {
        throw withoutBearer(err, token);
      }
    };
    let transport: Transport;
    if (options.transport) {
      transport = options.transport(bearer);
    } else {
      this.#sessions = new Http2SessionManager(this.baseUrl);
      transport = createConnectTransport({
        baseUrl: this.baseUrl,
        httpVersion: "2",
        sessionManager: this.#sessions,
        interceptors: [bearer],
        readMaxBytes: MaxMessageBytes,
      });
    }
    this.timeoutMs = options.timeoutMs ?? DefaultTimeoutMs;
    this.retry = options.retry ?? DefaultRetry;
    this.transport = withRetry(transport, this.timeoutMs, this.retry);
    this.auth = createClient(AuthService, this.transport);
    this.agent = createClient(AgentService, this.transport);
    this.capability = createClient(CapabilityService, this.transport);
    this.tool = createClient(ToolService, this.transport);
    this.supervisor = createClient(SupervisorService, this.transport);
    this.lease = createClient(LeaseService, this.transport);
  }

  /**
   * Returns a connection to baseUrl ("http://host:port" for HTTP/2
   * cleartext, "https://…" for TLS) presenting token.
   */
  static dial(baseUrl: string, token: string, options?: DialOptions): Conn {
    return new Conn(baseUrl, token, options);
  }

  /** The current bearer token. Never log it. */
  get token(): string {
    return this.#token;
  }

  /** Replaces the bearer token (a refreshed credential). */
  setToken(token: string): void {
    this.#token = token;
  }

  /** Closes the HTTP/2 connection (only the one this Conn opened itself). */
  close(): void {
    this.#sessions?.abort();
  }
}

/**
 * transport with timeoutMs as the deadline of each unary call that gives
 * none (connect's defaultTimeoutMs would give it to streams too).
 */
function withUnaryTimeout(transport: Transport, timeoutMs: number): Transport {
  if (!(timeoutMs > 0)) return transport;
  return {
    unary: (method, signal, callTimeoutMs, header, input, contextValues) =>
      transport.unary(method, signal, callTimeoutMs ?? timeoutMs, header, input, contextValues),
    stream: (method, signal, callTimeoutMs, header, input, contextValues) =>
      transport.stream(method, signal, callTimeoutMs, header, input, contextValues),
  };
}

/**
 * transport with retry's retries of unary calls refused
 * `resource_exhausted` with a retry hint ({@link RetryOptions}), all
 * within the call's deadline (its own timeoutMs, else timeoutMs).
 */
function withRetry(transport: Transport, timeoutMs: number, retry: RetryOptions): Transport {
  const attempts = retry.attempts ?? DefaultRetry.attempts;
  if (!(attempts > 1)) return withUnaryTimeout(transport, timeoutMs);
  const maxWaitMs = retry.maxWaitMs ?? DefaultRetry.maxWaitMs;
  const now = retry.now ?? Date.now;
  const jitter = retry.jitter ?? Math.random;
  const wait = retry.wait ?? sleep;
  return {
    async unary(method, signal, callTimeoutMs, header, input, contextValues) {
      const total = callTimeoutMs ?? (timeoutMs > 0 ? timeoutMs : undefined);
      const deadline = total === undefined ? undefined : now() + total;
      for (let attempt = 1; ; attempt++) {
        // The first attempt has the whole timeout; a retry what is left.
        const left = attempt === 1 || deadline === undefined ? total : Math.max(1, deadline - now());
        try {
          return await transport.unary(method, signal, left, header, input, contextValues);
        } catch (err) {
          const hint = retryHintMs(err);
          if (attempt >= attempts || hint === undefined || hint > maxWaitMs) throw err;
          if (deadline !== undefined && now() + hint > deadline) throw err;
          let ms = Math.min(stretched(hint, jitter), maxWaitMs);
          if (deadline !== undefined) ms = Math.min(ms, deadline - now());
          try {
            await wait(ms, signal);
          } catch {
            throw err; // the refusal says more than the abort
          }
        }
      }
    },
    stream: (method, signal, callTimeoutMs, header, input, contextValues) =>
      transport.stream(method, signal, callTimeoutMs, header, input, contextValues),
  };
}

/**
 * hint stretched by up to half again at random, so that callers refused
 * together (a host's agents reconnecting at once) do not all come back at
 * the same instant.
 */
export function stretched(hint: number, jitter: () => number = Math.random): number {
  return hint + (hint * jitter()) / 2;
}

/**
 * Waits ms by retry's wait (default a timer): how {@link Agent.run} waits
 * before it reconnects. false when the wait failed (signal aborted).
 */
export async function waitBy(retry: Readonly<RetryOptions>, ms: number, signal?: AbortSignal): Promise<boolean> {
  try {
    await (retry.wait ?? sleep)(ms, signal);
    return true;
  } catch {
    return false;
  }
}

/** Waits ms, rejecting when signal aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A stream's messages, whose error carries neither token nor its signature. */
async function* messagesWithoutBearer<T>(messages: AsyncIterable<T>, token: string): AsyncGenerator<T> {
  try {
    yield* messages;
  } catch (err) {
    throw withoutBearer(err, token);
  }
}

/**
 * err, or when its message, its causes, its metadata or its details carry
 * token or token's signature, a new error of the same code without them:
 * the message with both cut out, the metadata and details that carry
 * either left out (a header's name cannot hold the mark, a detail's
 * Protobuf bytes cannot be cut and stay whole), and no cause.
 */
function withoutBearer(err: unknown, token: string): unknown {
  if (token === "") return err;
  const signature = tokenSignature(token);
  const holds = (text: string) => text.includes(token) || (signature !== "" && text.includes(signature));
  const detailHolds = (d: ConnectError["details"][number]) =>
    holds(JSON.stringify(d, (_key, v: unknown) => (v instanceof Uint8Array ? Buffer.from(v).toString("latin1") : typeof v === "bigint" ? String(v) : v)));
  let causeHolds = false;
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    causeHolds ||= holds(e instanceof Error ? e.message : String(e));
  }
  if (!(err instanceof ConnectError)) {
    return causeHolds ? new Error(withoutSecret(err instanceof Error ? err.message : String(err), token, "bearer token")) : err;
  }
  const metadataHolds = [...err.metadata].some(([k, v]) => holds(k) || holds(v));
  if (!causeHolds && !metadataHolds && !err.details.some(detailHolds)) return err;
  const metadata = new Headers();
  for (const [k, v] of err.metadata) if (!holds(k)) metadata.append(k, withoutSecret(v, token, "bearer token"));
  const out = new ConnectError(withoutSecret(err.rawMessage, token, "bearer token"), err.code, metadata);
  out.details = err.details.filter((d) => !detailHolds(d));
  return out;
}
