"""Connect over HTTP/1.1 with JSON bodies, on the standard library only.

Unary calls are ``POST /tether.v1.<Service>/<Method>`` with a JSON body;
server streams use the Connect streaming envelope (a flags byte, a 4-byte
big-endian length, the JSON message) and end with an end-of-stream message
(flag 0x02) that carries the error, if any. Errors become ConnectError with
the Connect code. Messages are plain dicts with the protobuf JSON mapping's
field names (lowerCamelCase); 64-bit integers arrive as strings, durations
as "1.5s", timestamps as RFC 3339 strings (see _wire).
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import re
import select
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlsplit

PACKAGE = "tether.v1"

# The Connect error codes (a closed set).
CANCELED = "canceled"
UNKNOWN = "unknown"
INVALID_ARGUMENT = "invalid_argument"
DEADLINE_EXCEEDED = "deadline_exceeded"
NOT_FOUND = "not_found"
ALREADY_EXISTS = "already_exists"
PERMISSION_DENIED = "permission_denied"
RESOURCE_EXHAUSTED = "resource_exhausted"
FAILED_PRECONDITION = "failed_precondition"
ABORTED = "aborted"
OUT_OF_RANGE = "out_of_range"
UNIMPLEMENTED = "unimplemented"
INTERNAL = "internal"
UNAVAILABLE = "unavailable"
DATA_LOSS = "data_loss"
UNAUTHENTICATED = "unauthenticated"

CODES = frozenset(
    {
        CANCELED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS,
        PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE,
        UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED,
    }
)

# Connect's mapping of HTTP statuses to codes, for errors without a body.
_HTTP_CODES = {
    400: INTERNAL,
    401: UNAUTHENTICATED,
    403: PERMISSION_DENIED,
    404: UNIMPLEMENTED,
    429: UNAVAILABLE,
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: UNAVAILABLE,
}

_END_STREAM = 0x02
_COMPRESSED = 0x01
# Larger messages are refused rather than read: nothing the control plane
# sends comes near it.
MAX_MESSAGE_BYTES = 16 << 20
# A bearer token is printable ASCII without spaces (a JWT is base64url and
# dots).
_BARE_TOKEN = re.compile(r"[!-~]+\Z")
# A compact JWS: three segments of base64url characters (no signature
# checked), as capability.CompactJWS in Go and compactJWS in TypeScript.
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\Z")
# The longest token the control plane's parsers take, its credentials' as
# its capability tokens' (capability.MaxTokenBytes; the verifier's
# MAX_TOKEN_BYTES).
MAX_TOKEN_BYTES = 8 << 10


class ConnectError(Exception):
    """An RPC failed. ``code`` is the Connect code (e.g. "permission_denied");
    ``message`` is the server's message; neither it, nor ``details``, nor an
    exception the error is chained to carries the token the call presented
    or that token's signature (a peer that echoes the request is cut out)."""

    def __init__(self, code: str, message: str, *, details: list | None = None, retry_after: float | None = None):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code if code in CODES else UNKNOWN
        self.message = message
        self.details = details or []
        # The wait, in seconds, a resource_exhausted refusal asks for before
        # the call is sent again (its Retry-After header); None: no hint.
        self.retry_after = retry_after if self.code == RESOURCE_EXHAUSTED else None


def is_bearer_token(token: object) -> bool:
    """Whether token is one a header can carry as a bearer token (text of
    printable ASCII without spaces, as a JWT is): what a Conn presents, and
    what an agent takes from an answer carrying a refreshed credential."""
    return isinstance(token, str) and bool(_BARE_TOKEN.match(token))


def compact_jws(token: object) -> bool:
    """Whether token has a compact JWS's shape within MAX_TOKEN_BYTES (no
    signature checked): the shape of every credential the control plane
    issues, and the only one an agent takes from an answer carrying a
    refreshed credential, as the Go (capability.CompactJWS) and TypeScript
    (compactJWS) agents. A token of any other shape is one the control
    plane never takes."""
    return isinstance(token, str) and 0 < len(token) <= MAX_TOKEN_BYTES and bool(_COMPACT_JWS.match(token))


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's whole seconds, or None."""
    v = (value or "").strip()
    if not v.isascii() or not v.isdigit() or len(v) > 6 or int(v) > 86400:
        return None
    return float(int(v))


@dataclass(frozen=True)
class Retry:
    """How a Conn retries a unary call the control plane refused
    resource_exhausted with a retry hint: a rate limit's refusal (its
    Retry-After header), which the control plane answers before the call
    does anything, so that sending it again is safe. A refusal without a
    hint (a bound that time alone does not lift: too many open streams or
    connections, a node's grants) is not retried, nor is a stream. The call
    waits the hint, stretched by up to half again at random so that callers
    refused together (a host's agents reconnecting at once) do not all come
    back at the same instant, then is sent again, at most ``attempts`` times
    in all, within the call's timeout; a hint longer than ``max_wait``, or
    one that would end past the timeout, is not waited for (the Go and
    TypeScript SDKs' rule). ``sleep``, ``jitter`` (a number in [0, 1)) and
    ``clock`` (seconds, for the timeout) are injected by tests."""

    attempts: int = 4
    max_wait: float = 10.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic


    def wait_after(self, err: "ConnectError", attempt: int, deadline: float | None) -> float | None:
        """The wait before attempt + 1 of a call refused with err at
        attempt (deadline: the call's, on ``clock``; None: none), or None
        when it is not to be sent again."""
        hint = err.retry_after
        if attempt >= self.attempts or hint is None or hint > self.max_wait:
            return None
        if deadline is not None and self.clock() + hint > deadline:
            return None
        wait = min(hint + hint * self.jitter() / 2, self.max_wait)
        if deadline is not None:
            wait = min(wait, deadline - self.clock())
        return wait


# A Conn's retry unless it is given another (the Go and TypeScript SDKs'
# default); Retry(attempts=1): never.
DEFAULT_RETRY = Retry()


def token_signature(token: str) -> str:
    """A token's signature, the part after its last dot: a JWT's header and
    claims are not secret, its signature makes a copy of it usable. "" when
    the token has no dot or the part is too short to be told from ordinary
    text. The one definition the bearer token's and the tool gate's
    redaction share (the Go and TypeScript SDKs' too)."""
    head, dot, signature = token.rpartition(".")
    return signature if dot and len(signature) >= 16 else ""


def without_secret(text: str, token: str, what: str) -> str:
    """text without token, nor its signature, naming what was cut
    ("[what]", "[what signature]")."""
    if not token:
        return text
    text = text.replace(token, f"[{what}]")
    signature = token_signature(token)
    return text.replace(signature, f"[{what} signature]") if signature else text


def _without_bearer(err: ConnectError, token: str) -> ConnectError | None:
    """A new error of err's code without token, nor its signature, when err's
    message, its details or an exception it is chained to carries either
    (a peer that echoes the request it refused: a proxy, or a hostile
    control plane); None when none does. Details that carry either are left
    out (a detail's Protobuf bytes cannot be cut and stay whole), and the
    new error is chained to nothing."""
    if not token:
        return None
    signature = token_signature(token)

    def holds(text: str) -> bool:
        return token in text or bool(signature) and signature in text

    def detail_holds(d: Any) -> bool:
        text = json.dumps(d, default=str)
        if isinstance(d, dict) and isinstance(d.get("value"), str):
            try:
                text += base64.b64decode(d["value"] + "=" * (-len(d["value"]) % 4)).decode("latin-1")
            except ValueError:
                pass
        return holds(text)

    dirty = holds(err.message) or any(detail_holds(d) for d in err.details)
    seen: set[int] = set()
    e: BaseException | None = err
    while not dirty and e is not None and id(e) not in seen:
        seen.add(id(e))
        dirty = holds(str(e)) or holds(repr(e.args))
        e = e.__cause__ or e.__context__
    if not dirty:
        return None
    return ConnectError(err.code, without_secret(err.message, token, "bearer token"),
                        details=[d for d in err.details if not detail_holds(d)], retry_after=err.retry_after)


def _quiet(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is open with nothing to read: one the
    peer closed reads its end, and one with bytes nobody asked for is not
    to be trusted with the next answer."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _error_from_json(body: Any, fallback: str) -> ConnectError:
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        return ConnectError(body["code"], str(body.get("message", "")), details=body.get("details"))
    return ConnectError(fallback, "")


# The idle HTTP/1.1 connections a Conn keeps for its next unary calls (the
# Go SDK's UnaryHTTP1Client keeps as many): a call takes one, or opens a
# new one when none is idle, and gives it back when its answer was read
# whole; one given back beyond the bound is closed.
MAX_IDLE_CONNECTIONS = 4
# An idle connection older than this is closed rather than used: well
# within the control plane's idle timeout (two minutes), which closes it
# on its side.
MAX_IDLE_SECONDS = 30.0


class Conn:
    """A connection to the control plane presenting one bearer token (an
    operator token, a tool server's token or an agent credential). The token
    can be replaced (credential refresh) while calls are in flight. Unary
    calls (and the key set's GET) reuse HTTP/1.1 keep-alive connections, at
    most MAX_IDLE_CONNECTIONS of them kept idle between calls (calls in
    flight together each take one); each stream opens its own. A Conn is
    safe to share between threads; close() closes its idle connections."""

    def __init__(self, base_url: str, token: str = "", *, timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None,
                 retry: Retry | None = None):
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be http://host:port or https://host:port")
        self.base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self._ssl = ssl_context
        self.timeout = timeout
        self.retry = DEFAULT_RETRY if retry is None else retry
        self._lock = threading.Lock()
        self._token = token
        # Idle keep-alive connections, each with when it was given back
        # (time.monotonic), the most recent last.
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []

    @property
    def token(self) -> str:
        with self._lock:
            return self._token

    def set_token(self, token: str) -> None:
        with self._lock:
            self._token = token

    def with_token(self, token: str) -> "Conn":
        """A connection to the same control plane presenting another token."""
        return Conn(self.base_url, token, timeout=self.timeout, ssl_context=self._ssl, retry=self.retry)

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _take(self, timeout: float | None) -> tuple[http.client.HTTPConnection, bool]:
        """An idle keep-alive connection still open (reused True), or a new
        one. An idle connection the peer closed, or that has something to
        read while no request is in flight, or idle too long, is closed."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if now - since <= MAX_IDLE_SECONDS and _quiet(conn):
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                return conn, True
            conn.close()
        return self._connection(timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Closes the idle keep-alive connections; a later call opens new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _headers(self, content_type: str, timeout: float | None, token: str) -> dict[str, str]:
        h = {"Content-Type": content_type, "Connect-Protocol-Version": "1", "User-Agent": "tether-agentsdk-python"}
        if token:
            if not is_bearer_token(token):
                # http.client would refuse it with the whole header value
                # (the token) in its error: refuse it here, unquoted.
                raise ConnectError(UNAUTHENTICATED, "the bearer token holds a space, line break or other character a header cannot carry "
                                   "(trim a token read from a file); it was not sent")
            h["Authorization"] = "Bearer " + token
        if timeout is not None:
            h["Connect-Timeout-Ms"] = str(max(1, int(timeout * 1000)))
        return h

    def _path(self, service: str, method: str) -> str:
        return f"{self._prefix}/{PACKAGE}.{service}/{method}"

    def _exchange(self, what: str, verb: str, path: str, body: bytes | None, headers: dict[str, str],
                  timeout: float | None, max_bytes: int) -> tuple[http.client.HTTPResponse, bytes]:
        """Sends one request and reads at most max_bytes + 1 of its answer
        before timeout passes (ConnectError deadline_exceeded, or
        unavailable when the exchange fails)."""
        conn, reused = self._take(timeout)
        # The socket's timeout bounds each read, not the call: a peer that
        # trickles its answer (a byte now and then) would hold the call for
        # as long as it liked. The call's deadline shuts the socket.
        expired = threading.Event()
        timer: threading.Timer | None = None
        keep = False
        try:
            try:
                try:
                    conn.request(verb, path, body=body, headers=headers)
                except (OSError, http.client.HTTPException):
                    if not reused:
                        raise
                    # The peer closed the idle connection as the request
                    # went out (its idle timeout): the request was not
                    # read whole. Once more, on a connection of its own.
                    conn.close()
                    conn, reused = self._connection(timeout), False
                    conn.request(verb, path, body=body, headers=headers)
                sock = conn.sock
                if timeout is not None and sock is not None:
                    def expire(sock: socket.socket = sock) -> None:
                        expired.set()
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

                    timer = threading.Timer(timeout, expire)
                    timer.daemon = True
                    timer.start()
                resp = conn.getresponse()
                data = resp.read(max_bytes + 1)
            except socket.timeout as e:
                raise ConnectError(DEADLINE_EXCEEDED, f"{what}: no answer within {timeout}s") from e
            except (OSError, http.client.HTTPException) as e:
                if expired.is_set():
                    raise ConnectError(DEADLINE_EXCEEDED, f"{what}: no whole answer within {timeout}s") from None
                raise ConnectError(UNAVAILABLE, f"{what}: {e.__class__.__name__}: {e}") from e
            if expired.is_set():
                raise ConnectError(DEADLINE_EXCEEDED, f"{what}: no whole answer within {timeout}s")
            # Kept for the next call only when its answer was read whole and
            # the peer keeps it open.
            keep = resp.isclosed() and not resp.will_close and len(data) <= max_bytes
        finally:
            if timer is not None:
                timer.cancel()
            if keep and not expired.is_set():
                self._give_back(conn)
            else:
                conn.close()
        return resp, data

    def get(self, path: str, *, max_bytes: int, timeout: float | None = None) -> bytes:
        """A plain GET of path (the key set) within the connection's
        timeout, refused beyond max_bytes; it presents no token."""
        timeout = self.timeout if timeout is None else timeout
        headers = {"User-Agent": "tether-agentsdk-python"}
        resp, data = self._exchange(f"GET {path}", "GET", self._prefix + path, None, headers, timeout, max_bytes)
        if resp.status != 200:
            raise ConnectError(_HTTP_CODES.get(resp.status, UNKNOWN), f"GET {path}: HTTP {resp.status}")
        if len(data) > max_bytes:
            raise ConnectError(RESOURCE_EXHAUSTED, f"GET {path}: answer larger than {max_bytes} bytes")
        return data

    def call(self, service: str, method: str, request: dict | None = None, *, timeout: float | None = None,
             retry: Retry | None = None) -> dict:
        """A unary call: ``conn.call("AgentService", "GetNode", {"nodeId": id})``.
        Its error carries neither the token it sent nor its signature. A
        refusal resource_exhausted with a retry hint is retried (``retry``,
        else the connection's Retry)."""
        r = self.retry if retry is None else retry
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else r.clock() + timeout
        attempt = 1
        while True:
            # The first attempt has the whole timeout; a retry what is left.
            left = timeout if attempt == 1 or deadline is None else max(0.001, deadline - r.clock())
            try:
                return self._call_once(service, method, request, left)
            except ConnectError as e:
                wait = r.wait_after(e, attempt, deadline)
                if wait is None:
                    raise
            r.sleep(wait)
            attempt += 1

    def _call_once(self, service: str, method: str, request: dict | None, timeout: float | None) -> dict:
        token = self.token
        try:
            return self._call(service, method, request, timeout, token)
        except ConnectError as e:
            clean = _without_bearer(e, token)
            if clean is None:
                raise
        raise clean  # outside the except: chained to nothing

    def _call(self, service: str, method: str, request: dict | None, timeout: float | None, token: str) -> dict:
        timeout = self.timeout if timeout is None else timeout
        body = json.dumps(request or {}).encode()
        resp, data = self._exchange(f"{service}.{method}", "POST", self._path(service, method), body,
                                    self._headers("application/json", timeout, token), timeout, MAX_MESSAGE_BYTES)
        if len(data) > MAX_MESSAGE_BYTES:
            raise ConnectError(RESOURCE_EXHAUSTED, f"{service}.{method}: answer larger than {MAX_MESSAGE_BYTES} bytes")
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = None
        if resp.status != 200:
            err = _error_from_json(decoded, _HTTP_CODES.get(resp.status, UNKNOWN))
            if err.code == RESOURCE_EXHAUSTED:
                err.retry_after = _retry_after(resp.getheader("Retry-After"))
            raise err
        if not isinstance(decoded, dict):
            raise ConnectError(INTERNAL, f"{service}.{method}: the answer is not a JSON object")
        return decoded

    def stream(self, service: str, method: str, request: dict | None = None, *, read_timeout: float | None = None,
               opening: Callable[["ServerStream"], None] | None = None) -> "ServerStream":
        """Opens a server stream. Iterate it for messages; a failure raises
        ConnectError. ``read_timeout`` bounds the silence between two
        messages (None: wait for ever; close() unblocks a reader).
        ``opening`` is given the stream before it is opened, so that another
        thread can close() it while it opens (the open then fails)."""
        s = ServerStream(self, service, method, request or {}, read_timeout)
        if opening is not None:
            opening(s)
        try:
            s._open()
            return s
        except ConnectError as e:
            clean = _without_bearer(e, s._token)
            if clean is None:
                raise
        raise clean  # outside the except: chained to nothing


class ServerStream:
    """A server stream's messages. ``close()`` may be called from another
    thread to end a blocked iteration (which then ends quietly)."""

    def __init__(self, conn: Conn, service: str, method: str, request: dict, read_timeout: float | None):
        self._conn = conn
        self._name = f"{service}.{method}"
        self._service, self._method, self._request = service, method, request
        self._read_timeout = read_timeout
        # The token the stream is opened with: its errors carry neither it
        # nor its signature.
        self._token = conn.token
        self._http: http.client.HTTPConnection | None = None
        # The connection's socket, kept from the request on: an answer whose
        # connection closes at its end (HTTP/1.0, or Connection: close: a
        # proxy's) leaves http.client's connection without it, and close()
        # could not reach a blocked reader, nor the read timeout be set.
        self._sock: socket.socket | None = None
        self._resp: http.client.HTTPResponse | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._reading = False
        self._closing_requested = False
        self.headers: dict[str, str] = {}

    def _open(self) -> None:
        conn = self._conn
        h = conn._headers("application/connect+json", None, self._token)
        body = json.dumps(self._request).encode()
        self._http = conn._connection(self._read_timeout if self._read_timeout else conn.timeout)
        try:
            self._http.request("POST", conn._path(self._service, self._method), body=struct.pack(">BI", 0, len(body)) + body, headers=h)
            with self._lock:
                self._sock = self._http.sock
                closing = self._closing_requested
            if closing and self._sock is not None:
                # close() came while the request was being sent: it could
                # not reach the socket, so the answer is not waited for.
                self._sock.shutdown(socket.SHUT_RDWR)
            self._resp = self._http.getresponse()
        except socket.timeout as e:
            self.close()
            raise ConnectError(DEADLINE_EXCEEDED, f"{self._name}: the stream did not open in time") from e
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise ConnectError(UNAVAILABLE, f"{self._name}: {e.__class__.__name__}: {e}") from e
        self.headers = {k.lower(): v for k, v in self._resp.getheaders()}
        if self._resp.status != 200:
            data = self._resp.read(MAX_MESSAGE_BYTES)
            self.close()
            try:
                decoded = json.loads(data) if data else None
            except ValueError:
                decoded = None
            raise _error_from_json(decoded, _HTTP_CODES.get(self._resp.status, UNKNOWN))
        # Once open, a stream waits as long as it is told to.
        sock = self._sock
        if sock is not None:
            sock.settimeout(self._read_timeout)

    def _read_exact(self, n: int) -> bytes:
        assert self._resp is not None
        out = b""
        while len(out) < n:
            chunk = self._resp.read(n - len(out))
            if not chunk:
                break
            out += chunk
        return out

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        try:
            return self._next_message()
        except ConnectError as e:
            clean = _without_bearer(e, self._token)
            if clean is None:
                raise
        raise clean  # outside the except: chained to nothing

    def _next_message(self) -> dict:
        with self._lock:
            if self._closed.is_set():
                raise StopIteration
            self._reading = True
        try:
            return self._next()
        except ConnectError:
            if self._closing_requested:
                raise StopIteration from None
            raise
        except StopIteration:
            raise
        except Exception as e:
            # A close() from another thread pulls the socket from under a
            # blocked read: whatever that raises means "closed".
            if self._closing_requested:
                raise StopIteration from None
            raise ConnectError(UNAVAILABLE, f"{self._name}: {e.__class__.__name__}: {e}") from e
        finally:
            with self._lock:
                self._reading = False
                release = self._closed.is_set()
            if release:
                self._release()

    def _next(self) -> dict:
        try:
            head = self._read_exact(5)
            if len(head) < 5:
                self._closed.set()
                if self._closing_requested:
                    raise StopIteration
                raise ConnectError(UNAVAILABLE, f"{self._name}: the stream ended without an end-of-stream message")
            flags, length = struct.unpack(">BI", head)
            if length > MAX_MESSAGE_BYTES:
                self._closed.set()
                raise ConnectError(RESOURCE_EXHAUSTED, f"{self._name}: a message of {length} bytes")
            data = self._read_exact(length)
            if len(data) < length:
                self._closed.set()
                raise ConnectError(UNAVAILABLE, f"{self._name}: the stream broke mid-message")
        except socket.timeout as e:
            self._closed.set()
            raise ConnectError(DEADLINE_EXCEEDED, f"{self._name}: no message within {self._read_timeout}s") from e
        except (OSError, http.client.HTTPException) as e:
            closing = self._closing_requested
            self._closed.set()
            if closing:
                raise StopIteration from None
            raise ConnectError(UNAVAILABLE, f"{self._name}: {e.__class__.__name__}: {e}") from e
        if flags & _COMPRESSED:
            self._closed.set()
            raise ConnectError(INTERNAL, f"{self._name}: a compressed message was not asked for")
        try:
            msg = json.loads(data) if data else {}
        except ValueError as e:
            self._closed.set()
            raise ConnectError(INTERNAL, f"{self._name}: a message is not JSON") from e
        if flags & _END_STREAM:
            self._closed.set()
            err = msg.get("error") if isinstance(msg, dict) else None
            if err:
                raise _error_from_json(err, UNKNOWN)
            raise StopIteration
        if not isinstance(msg, dict):
            self._closed.set()
            raise ConnectError(INTERNAL, f"{self._name}: a message is not a JSON object")
        return msg

    def close(self) -> None:
        """Ends the stream; safe from any thread, and twice. A reader
        blocked in another thread wakes up and its iteration ends."""
        with self._lock:
            self._closing_requested = True
            self._closed.set()
            reading = self._reading
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not reading:
            self._release()

    def _release(self) -> None:
        for part in (self._resp, self._http):
            if part is not None:
                try:
                    part.close()
                except Exception:
                    pass

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> "ServerStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_F = TypeVar("_F", bound="StreamFollower")


def close_stream(stream: "ServerStream | None") -> None:
    """Closes the stream a follower leaves on a message it could not use
    (one of the wrong shape: a proxy's, or a hostile peer's), before it
    opens another."""
    if stream is not None:
        stream.close()


class StreamFollower:
    """What a client that follows a server stream on a daemon thread shares:
    the stop event, the open stream and the thread, which ``close`` stops,
    and ``with`` around ``start`` and ``close``. A subclass's ``start``
    starts the thread (``_follow_in_thread``); its loop leaves when
    ``_stop`` is set and keeps the stream it reads in ``_stream``."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream = None

    def start(self: _F) -> _F:
        raise NotImplementedError

    def _follow_in_thread(self, target: Callable[[], None], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self: _F) -> _F:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
