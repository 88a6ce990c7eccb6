// Offline verification of capability tokens: the same checks, limits and
// error kinds as the Go module's capability.Verifier, with node's crypto
// for Ed25519.
import { createPublicKey, verify as verifySignature, type KeyObject } from "node:crypto";

/** The aud of capability tokens: tokens for tools, never accepted as credentials. */
export const Audience = "tether-tools";
/** The only JWS algorithm Tether signs or accepts. */
export const Algorithm = "EdDSA";
export const MaxTokenBytes = 8 << 10;
export const MaxTokenTtlMs = 15 * 60_000;
export const DefaultLeewayMs = 5_000;
export const MaxLeewayMs = 30_000;
export const MaxIdBytes = 128;
export const MaxChainDepth = 16;
export const MaxScopes = 32;
export const MaxScopeBytes = 128;

/** Why a token was refused; the same sentinels as the Go capability package. */
export type TokenErrorKind =
  | "feed_stale"
  | "grant_revoked"
  | "token_expired"
  | "token_not_yet_valid"
  | "token_too_large"
  | "token_malformed"
  | "token_algorithm"
  | "unknown_key"
  | "token_signature"
  | "token_issuer"
  | "token_audience"
  | "token_claims"
  | "scope_not_granted"
  | "tree_not_followed";

/**
 * Whether token has a compact JWS's shape within {@link MaxTokenBytes}
 * (the control plane's own parsers' bound, its credentials' as its
 * capability tokens'): three segments of base64url characters, no
 * signature checked, as the Go SDK's `capability.CompactJWS`. A token of
 * any other shape is one no verifier of Tether's takes; one of this shape
 * may still fail verification.
 */
export function compactJWS(token: string): boolean {
  return typeof token === "string" && token !== "" && token.length <= MaxTokenBytes && token.split(".").length === 3 && /^[A-Za-z0-9_.-]*$/.test(token);
}

/** A refused token. The message names the grant or claim, never the token. */
export class TokenError extends Error {
  override readonly name = "TokenError";
  constructor(
    readonly kind: TokenErrorKind,
    message: string,
  ) {
    super(`tether: ${kind.replaceAll("_", " ")}: ${message}`);
  }
}

/** The verified contents of a capability token. */
export interface Claims {
  /** The jti: the grant the token was minted from. */
  grantId: string;
  /** The sub: the node holding the grant. */
  holderNodeId: string;
  /** Ancestor grant ids, root first, excluding grantId. */
  chain: string[];
  scopes: string[];
  issuedAt: Date;
  notBefore: Date;
  expiresAt: Date;
  keyId: string;
  /**
   * The root claim: the root node id of the holder's tree, "" in a token
   * minted before tokens named their tree. A verifier following one tree's
   * revocations (an agent's credential) refuses a token of another
   * ("tree_not_followed").
   */
  root: string;
}

/** Finds the public key for a kid, or undefined when unknown. */
export type KeyLookup = (kid: string) => KeyObject | undefined;

function printableAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

function idProblem(field: string, id: unknown): string | undefined {
  if (typeof id !== "string" || id === "") return `${field} is required`;
  if (id.length > MaxIdBytes) return `${field} of ${id.length} bytes exceeds ${MaxIdBytes}`;
  if (!printableAscii(id)) return `${field} has a non-printable or non-ASCII byte`;
  return undefined;
}

/** Reports whether s is a well-formed scope or scope pattern (see the Go capability.ValidateScope). */
export function validScope(s: string): boolean {
  if (typeof s !== "string" || s === "" || s.length > MaxScopeBytes || !printableAscii(s)) return false;
  const star = s.indexOf("*");
  if (star !== -1 && star !== s.length - 1) return false;
  return !(s.startsWith(":") || s.endsWith(":") || s.includes("::"));
}

/** Reports whether the granted scopes permit the required one: some granted scope covers it. */
export function allows(granted: string[], required: string): boolean {
  if (!validScope(required)) return false;
  return granted.some((g) => validScope(g) && (g.endsWith("*") ? required.startsWith(g.slice(0, -1)) : g === required));
}

const base64url = /^[A-Za-z0-9_-]*$/;

function decodeSegment(segment: string, what: string): Buffer {
  // Strict: base64url without padding, and canonical (re-encodes to itself),
  // so one token has exactly one accepted spelling.
  if (!base64url.test(segment) || segment.length % 4 === 1) throw new TokenError("token_malformed", `${what} is not base64url`);
  const bytes = Buffer.from(segment, "base64url");
  if (bytes.toString("base64url") !== segment) throw new TokenError("token_malformed", `${what} is not canonical base64url`);
  return bytes;
}

/**
 * The nesting a token's header and claims may have (the top-level object is
 * depth 1), as the control plane's check (capability.MaxJSONDepth): Python
 * refused claims nested past its recursion limit, which Go and JSON.parse
 * accepted.
 */
export const MaxJsonDepth = 64;

/** The deepest nesting of arrays and objects in valid JSON text. */
function jsonDepth(text: string): number {
  let depth = 0;
  let deepest = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
    } else if (c === "[" || c === "{") {
      deepest = Math.max(deepest, ++depth);
    } else if (c === "]" || c === "}") {
      depth--;
    }
  }
  return deepest;
}

function parseObject(bytes: Buffer, what: string): Record<string, unknown> {
  let value: unknown;
  const text = bytes.toString("utf8");
  try {
    value = JSON.parse(text);
  } catch {
    throw new TokenError("token_malformed", `${what} is not JSON`);
  }
  if (jsonDepth(text) > MaxJsonDepth) throw new TokenError("token_malformed", `${what} nested deeper than ${MaxJsonDepth}`);
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new TokenError("token_malformed", `${what} is not a JSON object`);
  return value as Record<string, unknown>;
}

/** The claim names a capability token is read by. */
const knownClaimNames = ["iss", "sub", "aud", "exp", "nbf", "iat", "jti", "chain", "scopes", "root"];

/**
 * The names of a valid JSON object's own members, in order, decoded.
 */
function topLevelNames(text: string): string[] {
  const names: string[] = [];
  let depth = 0;
  let expectName = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      if (depth === 1 && expectName) names.push(JSON.parse(text.slice(i, j + 1)) as string);
      expectName = false;
      i = j;
    } else if (c === "{" || c === "[") {
      depth++;
      expectName = c === "{" && depth === 1;
    } else if (c === "}" || c === "]") {
      depth--;
    } else if (c === ",") {
      expectName = depth === 1;
    }
  }
  return names;
}

/**
 * Refuses claims naming a known claim twice, or in another case ("SUB",
 * "\u017fub"), as the control plane's check does: Go's encoding/json
 * matches names case-insensitively (ASCII case, and U+017F for s, U+212A
 * for k), where JSON.parse reads the exact name, keeping the last.
 */
function checkClaimNames(text: string): void {
  const seen = new Set<string>();
  for (const name of topLevelNames(text)) {
    const folded = name.replace(/[A-Z]/g, (c) => c.toLowerCase()).replace(/\u017f/g, "s").replace(/\u212a/g, "k");
    if (!knownClaimNames.includes(folded)) continue;
    if (name !== folded || seen.has(folded)) throw new TokenError("token_malformed", `claim ${folded} is named twice or in another case`);
    seen.add(folded);
  }
}

/**
 * A time claim in whole seconds, rounded down, as the control plane reads
 * it (golang-jwt's NumericDate, to the second): a fractional exp was
 * accepted up to a second after the control plane's expiry.
 */
function numeric(claims: Record<string, unknown>, name: string): number | undefined {
  const v = claims[name];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new TokenError("token_claims", `${name} has the wrong type`);
  return Math.floor(v);
}

function stringList(claims: Record<string, unknown>, name: string): string[] {
  const v = claims[name] ?? [];
  if (!Array.isArray(v) || v.some((s) => typeof s !== "string")) throw new TokenError("token_claims", `${name} must be a list of strings`);
  return v as string[];
}

/**
 * A time claim for an error: its date, or its seconds when no Date holds
 * it (toISOString threw a RangeError, not a TokenError, for an nbf of
 * 2^63 seconds).
 */
function describeSeconds(seconds: number): string {
  const date = new Date(seconds * 1000);
  return Number.isNaN(date.getTime()) ? `${seconds} s since the epoch` : date.toISOString();
}

/** Options for {@link verifyToken}. */
export interface VerifyOptions {
  issuer?: string;
  audience?: string;
  leewayMs?: number;
}

/**
 * Checks a capability token's signature and claims at nowMs and returns
 * its claims. It does not consult tombstones: {@link Verifier} does that.
 */
export function verifyToken(token: string, keys: KeyLookup, nowMs: number, options: VerifyOptions = {}): Claims {
  const issuer = options.issuer ?? "tether";
  const audience = options.audience ?? Audience;
  const leeway = options.leewayMs ?? DefaultLeewayMs;
  if (leeway < 0 || leeway > MaxLeewayMs) throw new RangeError(`tether: leeway ${leeway} ms is outside [0, ${MaxLeewayMs}]`);
  if (typeof token !== "string" || token.length > MaxTokenBytes) throw new TokenError("token_too_large", `over ${MaxTokenBytes} bytes`);
  const parts = token.split(".");
  if (!compactJWS(token)) throw new TokenError("token_malformed", "not a compact JWS (only base64url and '.' are allowed)");
  const header = parseObject(decodeSegment(parts[0], "header"), "header");
  const payload = decodeSegment(parts[1], "payload");
  const signature = decodeSegment(parts[2], "signature");
  if (header.alg !== Algorithm) {
    const alg = typeof header.alg === "string" && header.alg.length <= 16 && printableAscii(header.alg) ? JSON.stringify(header.alg) : "missing or malformed";
    throw new TokenError("token_algorithm", `alg ${alg}; only ${Algorithm} is accepted`);
  }
  if ("crit" in header) throw new TokenError("token_malformed", "crit header is not supported");
  const kid = header.kid;
  if (typeof kid !== "string" || kid === "") throw new TokenError("token_malformed", "kid header is missing");
  if (kid.length > MaxIdBytes || !printableAscii(kid)) throw new TokenError("token_malformed", "kid header is malformed");
  const key = keys(kid);
  if (!key) throw new TokenError("unknown_key", `kid ${JSON.stringify(kid)}`);
  const signed = Buffer.from(`${parts[0]}.${parts[1]}`, "ascii");
  if (signature.length !== 64 || !verifySignature(null, signed, key, signature)) throw new TokenError("token_signature", "signature does not verify");

  const claims = parseObject(payload, "claims");
  checkClaimNames(payload.toString("utf8"));
  if (claims.iss === undefined || claims.iss === "") throw new TokenError("token_issuer", "iss is missing");
  if (claims.iss !== issuer) throw new TokenError("token_issuer", "iss is not the expected issuer");
  const aud = typeof claims.aud === "string" ? [claims.aud] : claims.aud;
  if (!Array.isArray(aud) || aud.length === 0) throw new TokenError("token_audience", "aud is missing");
  // As golang-jwt's ClaimStrings: a list holding anything but strings is
  // malformed, whatever else it names.
  if (aud.some((a) => typeof a !== "string")) throw new TokenError("token_audience", "aud holds something other than strings");
  if (!aud.includes(audience)) throw new TokenError("token_audience", "aud does not include the expected audience");
  const exp = numeric(claims, "exp");
  const nbf = numeric(claims, "nbf");
  const iat = numeric(claims, "iat");
  if (exp === undefined) throw new TokenError("token_claims", "exp is required");
  if (nowMs >= exp * 1000 + leeway) throw new TokenError("token_expired", `expired at ${describeSeconds(exp)} (leeway ${leeway} ms)`);
  if (nbf !== undefined && nowMs < nbf * 1000 - leeway) throw new TokenError("token_not_yet_valid", `not before ${describeSeconds(nbf)} (leeway ${leeway} ms)`);
  if (iat !== undefined && nowMs < iat * 1000 - leeway) throw new TokenError("token_not_yet_valid", `issued in the future (leeway ${leeway} ms)`);

  const jtiProblem = idProblem("jti", claims.jti) ?? idProblem("sub", claims.sub);
  if (jtiProblem) throw new TokenError("token_claims", jtiProblem);
  const grantId = claims.jti as string;
  const chain = stringList(claims, "chain");
  if (chain.length > MaxChainDepth) throw new TokenError("token_claims", `chain of ${chain.length} ancestors exceeds ${MaxChainDepth}`);
  chain.forEach((id, i) => {
    const problem = idProblem("chain entry", id);
    if (problem) throw new TokenError("token_claims", problem);
    if (id === grantId) throw new TokenError("token_claims", "chain contains the grant itself");
    if (chain.indexOf(id) !== i) throw new TokenError("token_claims", "chain repeats a grant id");
  });
  const root = claims.root ?? "";
  if (typeof root !== "string") throw new TokenError("token_claims", "root must be a string");
  const rootProblem = root === "" ? undefined : idProblem("root", root);
  if (rootProblem) throw new TokenError("token_claims", rootProblem);
  const scopes = stringList(claims, "scopes");
  if (scopes.length === 0 || scopes.length > MaxScopes) throw new TokenError("token_claims", `${scopes.length} scopes is outside [1, ${MaxScopes}]`);
  if (!scopes.every(validScope)) throw new TokenError("token_claims", "a scope is malformed");
  if (iat === undefined || nbf === undefined) throw new TokenError("token_claims", "iat, nbf and exp are required");
  if (!(exp > iat) || !(exp > nbf) || (exp - iat) * 1000 > MaxTokenTtlMs) {
    throw new TokenError("token_claims", `lifetime from iat to exp must be within (0, ${MaxTokenTtlMs / 60_000} min]`);
  }
  return {
    grantId,
    holderNodeId: claims.sub as string,
    chain,
    scopes,
    issuedAt: new Date(iat * 1000),
    notBefore: new Date(nbf * 1000),
    expiresAt: new Date(exp * 1000),
    keyId: kid,
    root,
  };
}

/** Parses a JWKS document into Ed25519 public keys by kid (other key types are skipped). */
export function parseJwks(body: unknown): Map<string, KeyObject> {
  const keys = new Map<string, KeyObject>();
  const twice = new Set<string>();
  const list = (body as { keys?: unknown })?.keys;
  if (!Array.isArray(list)) throw new Error("tether: parse jwks: no keys array");
  for (const k of list as Record<string, unknown>[]) {
    if (k?.kty !== "OKP" || k?.crv !== "Ed25519") continue;
    const x = typeof k.x === "string" ? Buffer.from(k.x, "base64url") : Buffer.alloc(0);
    if (x.length !== 32 || typeof k.kid !== "string" || k.kid === "") throw new Error(`tether: parse jwks: key ${JSON.stringify(k.kid)} is malformed`);
    if (keys.has(k.kid)) twice.add(k.kid);
    keys.set(k.kid, createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: k.x as string }, format: "jwk" }));
  }
  // A kid listed twice names no key, as for the control plane's check
  // (Go's read the first, this the last: a token signed by either read
  // differently per SDK).
  for (const kid of twice) keys.delete(kid);
  return keys;
}
