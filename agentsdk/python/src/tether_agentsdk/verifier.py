"""Verifier: capability tokens checked for a tool or resource server.

Offline when the ``cryptography`` package is importable: the EdDSA
signature against the control plane's JWKS, the claims with the same rules
as the control plane, and revocation against tombstones that follow the
revocation feed (``CapabilityService.WatchRevocations``); every check fails
closed once the feed is older than the staleness budget. Without
``cryptography`` each check asks the control plane (``Introspect``).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _wire
from ._connect import ConnectError, Conn, StreamFollower, close_stream, without_secret

log = logging.getLogger("tether_agentsdk")

try:  # the optional extra
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    HAVE_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - exercised by the bare test run
    HAVE_CRYPTOGRAPHY = False

#: The aud of capability tokens: for tools, never accepted as credentials.
AUDIENCE = "tether-tools"
JWKS_PATH = "/.well-known/jwks.json"
DEFAULT_STALENESS_BUDGET = 10.0
DEFAULT_LEEWAY = 5.0
MAX_LEEWAY = 30.0
MAX_TOKEN_BYTES = 8 << 10
MAX_TOKEN_TTL = 15 * 60
MAX_CHAIN_DEPTH = 16
MAX_SCOPES = 32
MAX_SCOPE_BYTES = 128
MAX_ID_BYTES = 128
#: Seconds between two fetches of the key set that no unknown kid caused
#: (the Go and TypeScript verifiers' interval): a key the control plane
#: pruned from its ring leaves the verifier's set within it.
JWKS_REFRESH_EVERY = 5 * 60.0
_ALPHABET = re.compile(r"^[A-Za-z0-9_.-]*$")


class VerifyError(Exception):
    """A token was not accepted. The message never contains the token."""


class FeedStale(VerifyError):
    """The revocation feed has not been heard from within the staleness
    budget (or not yet): every verification fails closed."""


class GrantRevoked(VerifyError):
    """The token's grant, or an ancestor grant, is revoked."""


class TokenExpired(VerifyError):
    """The token is past its exp (beyond the leeway)."""


class TokenInvalid(VerifyError):
    """Malformed, badly signed, for another issuer or audience, or with
    claims outside the rules."""


class ScopeNotGranted(VerifyError):
    """A valid, unrevoked token without the scope the call needs."""


class TreeNotFollowed(VerifyError):
    """The verifier follows one tree's revocations only (its conn holds an
    agent's credential) and the token is another tree's, or names none
    (minted before tokens named their tree): that tree's revocations are
    never heard here. Verify such tokens with a verifier following the
    whole feed (a tool server's or a viewer's token)."""


@dataclass(frozen=True)
class Claims:
    grant_id: str
    holder_node_id: str
    chain: tuple[str, ...]
    scopes: tuple[str, ...]
    issued_at: float
    not_before: float
    expires_at: float
    key_id: str = ""
    # The root claim: the root node id of the holder's tree, "" in a token
    # minted before tokens named their tree.
    root: str = ""


def _scope_ok(s: Any) -> bool:
    if not isinstance(s, str) or not s or len(s) > MAX_SCOPE_BYTES:
        return False
    if any(c < "!" or c > "~" for c in s):
        return False
    if "*" in s[:-1]:
        return False
    return not (s.startswith(":") or s.endswith(":") or "::" in s)


def allows(granted: list[str] | tuple[str, ...], required: str) -> bool:
    """Whether the granted scopes permit ``required``: a concrete scope
    covers only itself; "p*" covers everything that starts with p."""
    if not _scope_ok(required):
        return False
    for g in granted:
        if not _scope_ok(g):
            continue
        if g.endswith("*"):
            if required.startswith(g[:-1]):
                return True
        elif g == required:
            return True
    return False


def _id_ok(s: Any) -> bool:
    return isinstance(s, str) and 0 < len(s) <= MAX_ID_BYTES and all("!" <= c <= "~" for c in s)


def _b64(part: str) -> bytes:
    if len(part) % 4 == 1:
        raise ValueError("bad base64url length")
    raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    # Strict: one spelling per value (no stray bits in the last character).
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
        raise ValueError("non-canonical base64url")
    return raw


def _number(claims: dict, name: str) -> float:
    """A time claim in whole seconds, rounded down, as the control plane
    reads it (golang-jwt's NumericDate, to the second): a fractional exp
    was accepted up to a second after the control plane's expiry. An
    integer past any float is refused, as Go refuses it, not an
    OverflowError out of the gate or tool server."""
    v = claims.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TokenInvalid(f"token claims: {name} is required")
    try:
        f = float(v)
    except OverflowError:
        raise TokenInvalid(f"token claims: {name} is out of range") from None
    if not math.isfinite(f):
        raise TokenInvalid(f"token claims: {name} is out of range")
    return float(math.floor(f))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# The nesting a token's header and claims may have (the top-level object is
# depth 1), as the control plane's check (capability.MaxJSONDepth): this
# parser refused claims nested past its recursion limit, which Go and
# JSON.parse accepted.
MAX_JSON_DEPTH = 64


def _json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in valid JSON text."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
        i += 1
    return deepest


def _json(raw: bytes) -> Any:
    """Parses a token segment as Go's encoding/json and JavaScript's
    JSON.parse do: UTF-8 (an invalid byte read as U+FFFD), no byte-order
    mark, no NaN or Infinity. json.loads of bytes also took UTF-16 and
    UTF-32, and a UTF-8 byte-order mark, and json.loads takes NaN and
    Infinity: tokens the control plane's check refuses."""
    text = raw.decode("utf-8", "replace")
    if _json_depth(text) > MAX_JSON_DEPTH:
        raise ValueError("nested too deep")
    return json.loads(text, parse_constant=_no_constant)


_KNOWN_CLAIMS = frozenset({"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "chain", "scopes", "root"})


def _check_claim_names(names: Any) -> None:
    """Refuses claims naming a known claim twice, or in another case
    ("SUB", "\u017fub"), as the control plane's check does: Go's
    encoding/json matches names case-insensitively (ASCII case, and U+017F
    for s, U+212A for k), where json.loads reads the exact name, keeping
    the last."""
    seen: set[str] = set()
    for name in names:
        folded = "".join(c.lower() if "A" <= c <= "Z" else c for c in name).replace("\u017f", "s").replace("\u212a", "k")
        if folded not in _KNOWN_CLAIMS:
            continue
        if name != folded or folded in seen:
            raise TokenInvalid(f"token malformed: claim {folded} is named twice or in another case")
        seen.add(folded)


def parse_capability_token(token: str, keys: dict[str, Any], *, issuer: str, now: float, leeway: float) -> Claims:
    """Verifies a capability token offline against ``keys`` (kid ->
    Ed25519PublicKey) with the control plane's rules, without consulting
    revocations."""
    if not isinstance(token, str):
        raise TokenInvalid("token malformed: no token, or not a string")
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenInvalid(f"token of {len(token)} bytes exceeds {MAX_TOKEN_BYTES}")
    if not _ALPHABET.match(token):
        raise TokenInvalid("token malformed: not a compact JWS (only base64url and '.' are allowed)")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenInvalid("token malformed: not a well-formed JWT")
    # The claims are parsed only once the signature holds: an unsigned
    # token costs one header parse. JSON nested past the parser's recursion
    # (a few thousand brackets fit the size limit) is a malformed token,
    # not an exception of another kind out of the gate or tool server.
    try:
        header = _json(_b64(parts[0]))
        payload = _b64(parts[1])
        signature = _b64(parts[2])
    except (ValueError, RecursionError):
        raise TokenInvalid("token malformed: not a well-formed JWT") from None
    if not isinstance(header, dict):
        raise TokenInvalid("token malformed: not a well-formed JWT")
    if header.get("alg") != "EdDSA":
        raise TokenInvalid("token algorithm not allowed: only EdDSA")
    if "crit" in header:
        raise TokenInvalid("token malformed: crit header is not supported")
    kid = header.get("kid")
    if not _id_ok(kid):
        raise TokenInvalid("token malformed: kid header is missing or malformed")
    key = keys.get(kid)
    if key is None:
        raise _UnknownKey(kid)
    try:
        key.verify(signature, (parts[0] + "." + parts[1]).encode())
    except InvalidSignature:
        raise TokenInvalid("token signature invalid") from None
    objects: list[list[tuple[str, Any]]] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict:
        objects.append(pairs)
        return dict(pairs)

    try:
        text = payload.decode("utf-8", "replace")
        if _json_depth(text) > MAX_JSON_DEPTH:
            raise ValueError("nested too deep")
        claims = json.loads(text, parse_constant=_no_constant, object_pairs_hook=pairs_hook)
    except (ValueError, RecursionError):
        raise TokenInvalid("token malformed: not a well-formed JWT") from None
    if not isinstance(claims, dict):
        raise TokenInvalid("token malformed: not a well-formed JWT")
    _check_claim_names(name for name, _ in objects[-1])
    if claims.get("iss") != issuer:
        raise TokenInvalid("token issuer invalid")
    aud = claims.get("aud")
    auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if not all(isinstance(a, str) for a in auds):
        # As golang-jwt's ClaimStrings: a list holding anything but strings
        # is malformed, whatever else it names.
        raise TokenInvalid("token audience invalid: aud holds something other than strings")
    if AUDIENCE not in auds:
        raise TokenInvalid("token audience invalid: not a capability token")
    exp, nbf, iat = _number(claims, "exp"), _number(claims, "nbf"), _number(claims, "iat")
    jti, sub = claims.get("jti"), claims.get("sub")
    if not _id_ok(jti) or not _id_ok(sub):
        raise TokenInvalid("token claims: jti and sub are required")
    if now >= exp + leeway:  # as the Go and TypeScript verifiers
        raise TokenExpired(f"token for grant {jti} expired")
    if nbf > now + leeway or iat > now + leeway:
        raise TokenInvalid(f"token for grant {jti} is not valid yet")
    chain = claims.get("chain")
    if chain is None:
        chain = []
    if not isinstance(chain, list) or len(chain) > MAX_CHAIN_DEPTH or not all(_id_ok(c) for c in chain) or jti in chain or len(set(chain)) != len(chain):
        raise TokenInvalid("token claims: chain malformed")
    root = claims.get("root")
    if root is None:
        root = ""
    if not isinstance(root, str) or root and not _id_ok(root):
        raise TokenInvalid("token claims: root malformed")
    scopes = claims.get("scopes")
    if not isinstance(scopes, list) or not (1 <= len(scopes) <= MAX_SCOPES) or not all(_scope_ok(s) for s in scopes):
        raise TokenInvalid("token claims: scopes malformed")
    if not (exp > iat and exp > nbf and exp - iat <= MAX_TOKEN_TTL):
        raise TokenInvalid(f"token claims: lifetime from iat to exp must be within (0, {MAX_TOKEN_TTL}s]")
    return Claims(grant_id=jti, holder_node_id=sub, chain=tuple(chain), scopes=tuple(scopes),
                  issued_at=iat, not_before=nbf, expires_at=exp, key_id=kid, root=root)


class _UnknownKey(TokenInvalid):
    def __init__(self, kid: str):
        super().__init__(f"token signed with an unknown key {kid!r}")
        self.kid = kid


def parse_jwks(data: bytes) -> dict[str, Any]:
    """kid -> Ed25519PublicKey for the OKP/Ed25519 keys of a JWKS."""
    doc = json.loads(data)
    keys: dict[str, Any] = {}
    twice: set[str] = set()
    for k in doc.get("keys", []):
        if k.get("kty") != "OKP" or k.get("crv") != "Ed25519":
            continue
        raw = _b64(k.get("x", ""))
        if len(raw) != 32 or not _id_ok(k.get("kid")):
            raise ValueError(f"jwks: key {k.get('kid')!r} is malformed")
        if k["kid"] in keys:
            twice.add(k["kid"])
        keys[k["kid"]] = Ed25519PublicKey.from_public_bytes(raw)
    # A kid listed twice names no key, as for the control plane's check
    # (Go's read the first, this the last: a token signed by either read
    # differently per SDK).
    for kid in twice:
        del keys[kid]
    return keys


def _drop_time(t: dict) -> float:
    """A feed tombstone's dropAfter in wall seconds, math.inf without one."""
    drop = _wire.parse_timestamp(t.get("dropAfter"))
    return math.inf if drop is None else drop.timestamp()


@dataclass
class _Tombstones:
    # grant id -> when its tombstone may be dropped (wall seconds; math.inf
    # when the feed gave none), read once as the tombstone arrives.
    by_grant: dict[str, float] = field(default_factory=dict)
    head: int = 0
    synced_at: float | None = None
    # The root node id of the one tree the feed follows (its treeRoot), ""
    # for the whole feed.
    tree: str = ""


class Verifier(StreamFollower):
    """Checks capability tokens for a tool or resource server.

    ``conn`` reaches the control plane with any reader's token (a viewer
    token, or an agent credential): the feed and Introspect need one.
    ``offline`` None means offline when ``cryptography`` is importable.
    Start it (``start()`` or ``with``) before verifying: offline, every
    check fails closed (FeedStale) until the feed's first message and
    whenever the feed is older than ``staleness_budget`` seconds. Keep the
    budget several times the control plane's feed heartbeat (two seconds).
    ``clock`` (wall seconds, for exp) and ``monotonic`` (for staleness) are
    injectable for tests; the feed's age never shortens when ``monotonic``
    steps back (its forward steps are added up), and a ``monotonic`` that
    reads earlier than at the feed's last message fails closed.
    """

    def __init__(self, conn: Conn, *, issuer: str = "tether", offline: bool | None = None,
                 staleness_budget: float = DEFAULT_STALENESS_BUDGET, leeway: float = DEFAULT_LEEWAY,
                 jwks_min_interval: float = 10.0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic):
        if offline is None:
            offline = HAVE_CRYPTOGRAPHY
        if offline and not HAVE_CRYPTOGRAPHY:
            raise RuntimeError("offline verification needs the cryptography package: pip install 'tether-agentsdk[crypto]'")
        if not 0 <= leeway <= MAX_LEEWAY:
            raise ValueError(f"leeway must be within [0, {MAX_LEEWAY}] seconds")
        super().__init__()
        self.conn = conn
        self.issuer = issuer
        self.offline = offline
        self.staleness_budget = staleness_budget
        self.leeway = leeway
        self.jwks_min_interval = jwks_min_interval
        self.clock = clock
        self.monotonic = monotonic
        # The feed's age is measured on _feed_now: the monotonic clock's
        # forward steps added up, a step back counted as no time.
        self._feed_lock = threading.Lock()
        self._feed_last: float | None = None
        self._feed_elapsed = 0.0
        self._feed_synced_raw: float | None = None
        self.ready = threading.Event()
        self._keys: dict[str, Any] = {}
        self._keys_lock = threading.Lock()
        self._last_on_demand: float | None = None
        # When the key set was last fetched on schedule (self.clock), and
        # whether such a fetch is under way (under _keys_lock).
        self._keys_fetched_at: float | None = None
        self._keys_refreshing = False
        self._state = _Tombstones()
        # A snapshot that spans several feed messages (each but its last
        # continues), gathered until its last: the set is replaced only
        # then. None when no snapshot is under way; the feed's thread only.
        self._snapshot: list[dict] | None = None
        # The earliest drop time in the set: a message prunes the set only
        # once the clock has passed it (the feed's thread only).
        self._next_drop = math.inf
        self._cond = threading.Condition()

    @property
    def mode(self) -> str:
        return "offline" if self.offline else "introspect"

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> "Verifier":
        """Offline: fetches the key set and follows the revocation feed in
        a daemon thread, fetching the key set again every
        JWKS_REFRESH_EVERY seconds. Introspecting: nothing to start; ready
        at once."""
        if not self.offline:
            self.ready.set()
            return self
        if self._thread is None:
            self._stop.clear()
            with self._keys_lock:
                self._keys_fetched_at = self.clock()
            try:
                self._fetch_jwks()
            except Exception as e:  # retried on the first unknown kid
                self._warn("tether: fetching the key set failed: %s", e)
            self._follow_in_thread(self._follow, "tether-revocations")
        return self

    # -- checks -------------------------------------------------------------------------

    def fresh(self) -> None:
        """Raises FeedStale unless the feed was heard from within the budget."""
        synced = self._state.synced_at
        if synced is None:
            raise FeedStale("revocation feed not yet received: failing closed")
        now, behind = self._feed_now()
        age = now - synced
        if age > self.staleness_budget:
            raise FeedStale(f"revocation feed last heard {age:.1f}s ago (budget {self.staleness_budget}s): failing closed")
        if behind:
            raise FeedStale("the clock went back past the revocation feed's last message: failing closed")

    def _feed_now(self, synced: bool = False) -> tuple[float, bool]:
        """The time the feed's age is measured on, which never goes back,
        and whether the clock reads earlier than at the feed's last message
        (noted as now when ``synced``). An injected ``monotonic`` that
        stepped back (an NTP step, a VM resumed, a clock that is not
        monotonic) took the step off the age of a feed that had died, and
        a dead feed read fresh: the clock's forward steps between two
        readings are added up, a step back counts as no time, and a clock
        behind the feed's last message fails closed until it passes that
        reading again or the feed speaks. Time that passed before a step
        back with no reading in between is not counted: only readings tell
        it."""
        with self._feed_lock:  # around the reading too: readings are taken in order
            raw = self.monotonic()
            if self._feed_last is not None and raw > self._feed_last:
                self._feed_elapsed += raw - self._feed_last
            self._feed_last = raw
            if synced:
                self._feed_synced_raw = raw
            behind = self._feed_synced_raw is not None and raw < self._feed_synced_raw
            return self._feed_elapsed, behind

    def verify(self, token: str) -> Claims:
        """Checks a token for use now and returns its claims; raises a
        VerifyError (FeedStale, GrantRevoked, TokenExpired, TokenInvalid)."""
        if not self.offline:
            return self._introspect(token)
        self.fresh()
        now = self.clock()
        try:
            claims = parse_capability_token(token, self._keys, issuer=self.issuer, now=now, leeway=self.leeway)
        except _UnknownKey:
            # A key rotated in since the last fetch, or a made-up kid:
            # refetch, rate-limited, and try once more.
            self._refetch_after_miss()
            claims = parse_capability_token(token, self._keys, issuer=self.issuer, now=now, leeway=self.leeway)
            # Again where the tombstones are read: the key set's answer
            # may have taken its time, and a feed that died meanwhile,
            # the budget passing, left a revocation unheard.
            self.fresh()
        by_grant = self._state.by_grant
        for gid in (*claims.chain, claims.grant_id):  # root first: the widest revocation is named
            if gid in by_grant:
                via = "" if gid == claims.grant_id else f" via ancestor grant {gid}"
                raise GrantRevoked(f"grant {claims.grant_id} is revoked{via}")
        tree = self._state.tree
        if tree and claims.root != tree:
            why = (f"the token for grant {claims.grant_id} names no tree (minted before tokens named theirs; refresh it)"
                   if not claims.root else
                   f"grant {claims.grant_id} is held in another tree, whose revocations it never hears of")
            raise TreeNotFollowed(f"this verifier follows only tree {tree}'s revocations (its connection holds an "
                                  f"agent's credential), and {why}; verify it with a verifier that follows every tree "
                                  f"(a tool server's or a viewer's token)")
        return claims

    @property
    def tree(self) -> str:
        """The root node id of the one tree whose revocations the verifier
        follows (its conn holds an agent's credential), or "" when it
        follows the whole feed or has heard nothing yet."""
        return self._state.tree

    def authorize(self, token: str, required_scope: str) -> Claims:
        """verify() plus the scope the call needs."""
        claims = self.verify(token)
        if not allows(claims.scopes, required_scope):
            shown = required_scope if _scope_ok(required_scope) else "(malformed scope)"
            raise ScopeNotGranted(f"grant {claims.grant_id} does not allow scope {shown!r}")
        return claims

    def _introspect(self, token: str) -> Claims:
        try:
            resp = self.conn.call("CapabilityService", "Introspect", {"token": token})
        except ConnectError as e:
            raise VerifyError(f"introspection failed: {e}") from None
        if not resp.get("active"):
            reason = resp.get("reason", "inactive")
            low = reason.lower()
            if "revoked" in low:
                raise GrantRevoked(reason)
            if "expired" in low:
                raise TokenExpired(reason)
            raise TokenInvalid(reason)
        grant = resp.get("grant", {})
        exp = _wire.parse_timestamp(resp.get("expiresAt"))
        return Claims(grant_id=grant.get("grantId", ""), holder_node_id=resp.get("holderNodeId", ""),
                      chain=tuple(grant.get("chain", [])), scopes=tuple(resp.get("scopes", [])),
                      issued_at=0.0, not_before=0.0, expires_at=exp.timestamp() if exp else 0.0)

    # -- the feed -----------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The last feed sequence applied."""
        return self._state.head

    def wait_for_sequence(self, sequence: int, timeout: float | None = None) -> bool:
        """Waits until the feed has applied ``sequence`` (e.g. the one a
        Revoke answered with); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state.head >= sequence, timeout)

    def _apply(self, msg: dict) -> None:
        tombstones = msg.get("tombstones", [])
        head = _wire.uint64(msg.get("headSequence"))
        continues = bool(msg.get("continues"))
        for t in tombstones:
            if not _id_ok(t.get("grantId")):
                self._snapshot = None
                raise ValueError("a tombstone without a grant id")
        # Each tombstone's drop time is read once, as it arrives. Every
        # message read again that of every tombstone the set held: a rogue
        # revoking grants it delegates, in a loop, had each of its
        # revocations cost every Python verifier a parse per tombstone held
        # (rogue39H), its feed's thread falling behind the feed while it
        # stayed fresh, an operator's revocation queued behind the flood.
        try:
            for t in tombstones:
                t["_dropAt"] = _drop_time(t)
        except ValueError:
            self._snapshot = None
            raise
        with self._cond:
            if msg.get("snapshot"):
                # A new copy starts (one cut off by a broken stream was
                # dropped with it).
                self._snapshot = []
            if self._snapshot is not None and not continues:
                # The snapshot's last message: the set becomes the copy, whole.
                tombstones = [*self._snapshot, *tombstones]
                self._snapshot = None
                state = _Tombstones(head=head, synced_at=self._state.synced_at, tree=self._state.tree)
                self._next_drop = math.inf
            else:
                # A snapshot that continues in the next message leaves the
                # old set whole until then (one replaced with its first
                # message forgot, until its last, every revocation the copy
                # sent later), which gains the copy's tombstones so far:
                # revocation only narrows.
                if self._snapshot is not None:
                    self._snapshot.extend(tombstones)
                state = _Tombstones(dict(self._state.by_grant), self._state.head, self._state.synced_at, self._state.tree)
            for t in tombstones:
                gid, drop = t.get("grantId"), t["_dropAt"]
                # Revocation only narrows: the later drop time is kept.
                state.by_grant[gid] = max(drop, state.by_grant.get(gid, -math.inf))
                self._next_drop = min(self._next_drop, drop)
                state.head = max(state.head, _wire.uint64(t.get("sequence")))
            if not continues:
                # A message cut short is not the feed's head: the verifier
                # is neither ready nor fresh again until the one that is.
                state.head = max(state.head, head)
            now = self.clock()
            if now > self._next_drop:
                # Only once the earliest drop time has passed, and then in
                # one pass that finds the next.
                self._next_drop = math.inf
                for gid, drop in list(state.by_grant.items()):
                    if drop < now:
                        del state.by_grant[gid]
                    else:
                        self._next_drop = min(self._next_drop, drop)
            # Freshness is this verifier's clock when the message arrived,
            # not the server's time in it.
            # The tree the feed follows, in the state that marks it fresh.
            tree = msg.get("treeRoot") or ""
            if not isinstance(tree, str):
                raise ValueError("a feed message whose treeRoot is not a string")
            state.tree = tree
            if not continues:
                state.synced_at, _ = self._feed_now(synced=True)
            self._state = state  # one reference swap: readers see old or new, whole
            self._cond.notify_all()
        if not continues:
            self.ready.set()

    def _follow(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            applied = 0
            try:
                # A stream silent for the budget is dead or stalled: the
                # verifier is failing closed by then, and a new one may do
                # better.
                # A snapshot cut off by the last stream's end is not
                # finished by this one: it resumes from the old position
                # and starts its own.
                self._snapshot = None
                stream = self.conn.stream("CapabilityService", "WatchRevocations",
                                          {"afterSequence": str(self._state.head)}, read_timeout=self.staleness_budget)
                self._stream = stream
                if self._stop.is_set():
                    stream.close()
                    return
                # The read timeout bounds a silence, not the wait for a
                # message: a peer trickling one (a byte now and then) would
                # hold the feed, failing closed, for as long as it liked. A
                # stream with no whole message for the budget is dropped,
                # as the Go and TypeScript verifiers drop it.
                watchdog = _Watchdog(stream, self.staleness_budget)
                try:
                    for msg in stream:
                        watchdog.kick()
                        self._apply(msg)
                        applied += 1
                        self._refresh_keys_when_due()
                        watchdog.kick()
                finally:
                    watchdog.stop()
                if self._stop.is_set():
                    return
                if watchdog.fired.is_set():
                    log.warning("tether: revocation feed: no whole message within %ss; reconnecting", self.staleness_budget)
            except Exception as e:  # noqa: BLE001 — a message of the wrong shape breaks the stream, never this thread
                close_stream(self._stream)
                if self._stop.is_set():
                    return
                self._warn("tether: revocation feed interrupted (%s: %s); reconnecting", e.__class__.__name__, e)
            if applied:
                backoff = 0.05
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _warn(self, message: str, *args: object) -> None:
        """Logs why the key set or the feed failed, without the connection's
        token or its signature: the peer writes the error (a key set's kid,
        a feed's refusal), and could quote the token the feed was opened
        with."""
        log.warning("%s", without_secret(message % args, self.conn.token, "bearer token"))

    # -- keys ----------------------------------------------------------------------------

    def _fetch_jwks(self) -> None:
        # Within the connection's timeout as a whole: urllib's bounded each
        # read, and a peer trickling the key set held the fetch (start(), a
        # check of an unknown kid) for as long as it liked.
        keys = parse_jwks(self.conn.get(JWKS_PATH, max_bytes=1 << 20))
        with self._keys_lock:
            self._keys = keys

    def _refresh_keys_when_due(self) -> None:
        """Fetches the key set again, on another thread, once
        JWKS_REFRESH_EVERY has passed on the verifier's clock since the last
        such fetch (or the clock went back past it): asked on each feed
        message (a heartbeat comes within the staleness budget). Only an
        unknown kid fetched it before, so a key the control plane pruned
        from its ring (rotated out, or out because it leaked) verified here
        until the process restarted, where the Go and TypeScript verifiers
        dropped it within five minutes. The feed's thread does not wait for
        the key set: a slow one does not hold the revocations."""
        now = self.clock()
        with self._keys_lock:
            last = self._keys_fetched_at
            if self._keys_refreshing or last is not None and 0 <= now - last < JWKS_REFRESH_EVERY:
                return
            self._keys_fetched_at = now
            self._keys_refreshing = True
        threading.Thread(target=self._refresh_keys, name="tether-jwks", daemon=True).start()

    def _refresh_keys(self) -> None:
        try:
            self._fetch_jwks()
        except Exception as e:  # the keys held stay; the next interval tries again
            self._warn("tether: refreshing the key set failed: %s", e)
        finally:
            with self._keys_lock:
                self._keys_refreshing = False

    def _refetch_after_miss(self) -> None:
        with self._keys_lock:
            now = self.monotonic()
            if self._last_on_demand is not None and now - self._last_on_demand < self.jwks_min_interval:
                return
            self._last_on_demand = now
        try:
            self._fetch_jwks()
        except Exception as e:
            self._warn("tether: refreshing the key set failed: %s", e)


class _Watchdog:
    """Closes a feed stream, and sets ``fired``, once no whole message came
    within the budget: one thread per stream, whose deadline each message
    moves, rather than a timer (a thread) started anew for every message,
    which a flood of revocations churned by the thousand."""

    def __init__(self, stream: Any, budget: float):
        self._stream = stream
        self._budget = budget
        self._cond = threading.Condition()
        self._deadline = time.monotonic() + budget
        self._stopped = False
        self.fired = threading.Event()
        threading.Thread(target=self._run, name="tether-revocations-watchdog", daemon=True).start()

    def kick(self) -> None:
        """Moves the deadline to a budget from now. It only ever moves
        later, so the thread is not woken: it looks again at the deadline
        it waited for."""
        with self._cond:
            self._deadline = time.monotonic() + self._budget

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopped:
                return
        self.fired.set()
        self._stream.close()
