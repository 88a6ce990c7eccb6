"""ToolGate and tool_gate: every tool call recorded in the control plane's
ledger, refused while the caller's subtree drains, cancelled on abort."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Union

from . import _wire
from ._connect import FAILED_PRECONDITION, INTERNAL, PERMISSION_DENIED, UNAUTHENTICATED, ConnectError, Conn, Retry, StreamFollower, close_stream, without_secret

log = logging.getLogger("tether_agentsdk")

#: The header a tool server reads the caller's capability token from.
CAPABILITY_HEADER = "X-Tether-Capability"

Token = Union[str, Callable[[], str]]


class ToolRefused(ConnectError):
    """The control plane refused to begin the call: permission_denied for a
    bad, revoked or too narrow token, failed_precondition while the caller's
    subtree drains or aborts. Its refusal of the token the call would
    present (a token source's refresh, a sub-agent's spawn) is one too. The
    tool did not run."""

    @property
    def draining(self) -> bool:
        return self.code == FAILED_PRECONDITION


class ToolCallCancelled(Exception):
    """The control plane cancelled the call (its subtree was aborted). Raised
    out of the gated block or function once the tool has returned and the
    cancellation was acknowledged, or on entering it, the block not run,
    when the cancel was ordered before the call began."""

    def __init__(self, call_id: str, reason: str = ""):
        super().__init__(f"tool call {call_id} cancelled by the control plane" + (f": {reason}" if reason else ""))
        self.call_id = call_id
        self.reason = reason


_current: contextvars.ContextVar["GateCall | None"] = contextvars.ContextVar("tether_gate_call", default=None)


def current_call() -> "GateCall | None":
    """The gated call the running code is inside, if any: a synchronous tool
    polls ``current_call().cancelled`` (or calls ``check()``) to observe a
    cancellation. A call that has ended is no one's current call: blocks
    left in another order than entered (a server's overlapping requests)
    restore a context variable to a call that ended meanwhile, and a fence
    asking in such code must not name it (``issued_generations``)."""
    call = _current.get()
    return call if call is not None and call._active else None


class GateCall:
    """One recorded call. ``cancelled`` is set when the control plane
    cancels it; an asyncio tool is cancelled (CancelledError) as well."""

    def __init__(self, gate: "ToolGate", call: dict):
        self.gate = gate
        self.record = call
        self.call_id: str = call["callId"]
        self.node_id: str = call.get("nodeId", "")
        self.grant_id: str = call.get("grantId", "")
        self.tool: str = call.get("tool", "")
        self.cancelled = threading.Event()
        self.reason = ""
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = True
        self._task_cancelled = False
        self._presented = ""  # the caller's token: kept out of what the gate reports
        self._begin_n = 0  # which of the gate's begins began it
        self._stopped_by_check = False

    def check(self) -> None:
        """Raises ToolCallCancelled once the call is cancelled."""
        if self.cancelled.is_set():
            # Noted for a framework that turns what its tool raised into
            # text for the model (the OpenAI Agents SDK): its adapter raises
            # it again, and the call is acknowledged as the one that stopped.
            self._stopped_by_check = True
            raise ToolCallCancelled(self.call_id, self.reason)

    def _cancel(self, reason: str) -> None:
        # Called with the gate's lock held.
        self.reason = reason
        self.cancelled.set()
        if self._task is not None and self._loop is not None:
            task = self._task

            def cancel_if_still_inside() -> None:
                # Runs on the task's loop, where the call also leaves: a call
                # that has already ended is not cancelled after the fact.
                if self._active:
                    self._task_cancelled = True
                    task.cancel(f"tether: {reason or 'cancelled by the control plane'}")

            try:
                self._loop.call_soon_threadsafe(cancel_if_still_inside)
            except RuntimeError:
                pass


#: The most cancel orders a gate holds for calls it has not registered,
#: however many begins are under way (the Go gate's MaxEarlyOrders): an
#: order is early by a round trip at most, and each begin settled walks the
#: orders held.
MAX_EARLY_ORDERS = 1024

# The longest call id of an order a gate holds, in UTF-8 bytes (the Go and
# TypeScript gates' bound): the control plane's call ids are some thirty
# bytes, and an order for a longer one (a hostile peer's, up to a message's
# 16 MiB each) is for no call this gate could begin.
_MAX_CALL_ID_BYTES = 256


def _clipped_id(call_id: str) -> str:
    """A call id as an error names it: quoted, or not at all past
    _MAX_CALL_ID_BYTES (a hostile peer's, up to a message's 16 MiB)."""
    if len(call_id.encode("utf-8", "replace")) <= _MAX_CALL_ID_BYTES:
        return repr(call_id)
    return f"(an id past {_MAX_CALL_ID_BYTES} bytes)"


# The most of a cancel order's reason a gate keeps, in UTF-8 bytes: the
# control plane's reasons are at most 1024 bytes (a termination's), and a
# hostile peer's (up to a message's 16 MiB, held for each of up to
# MAX_EARLY_ORDERS early orders, and the message of the ToolCallCancelled a
# tool raises) is cut there. The Go and TypeScript gates keep no reason.
_MAX_REASON_BYTES = 1024


def _clip_reason(reason: object) -> str:
    """A cancel order's reason as a gate keeps it: text, at most
    _MAX_REASON_BYTES of UTF-8, cut at a character boundary."""
    if not isinstance(reason, str):
        return ""
    if len(reason) * 4 <= _MAX_REASON_BYTES:
        return reason
    return reason.encode("utf-8", "replace")[:_MAX_REASON_BYTES].decode("utf-8", "ignore")

#: How long a gate waits for the control plane's answer to a begin, an end
#: or an acknowledgement, in seconds, when its connection's timeout is not
#: shorter (the Go and TypeScript gates' 10 s): a begin under way is what
#: lets an early cancel order be held, and a held answer must not hold the
#: tool's caller for the connection's 30 s.
GATE_CALL_TIMEOUT = 10.0

#: The most threads a gate runs an asyncio call's begin and report on, its
#: own: on the loop's default executor (``asyncio.to_thread``), a few
#: threads (``min(32, cores + 4)``) the tools' own blocking work shares, a
#: rogue caller whose input hung that work (a URL of a server that never
#: answers) in as many calls held every other agent's calls on the server,
#: none begun and none reported for as long as it liked (rogue41G test).
#: Here a call waits only for other calls' begins and reports, each one
#: round trip to the control plane (GATE_CALL_TIMEOUT at most).
GATE_THREADS = 32

#: How long a gate with calls in flight (or begins under way) keeps one
#: WatchCancels stream before it opens another, in seconds (the Go gate's
#: ``agentsdk.CancelWatchRefresh``). The stream carries cancel orders only,
#: so a silent one is what an honest control plane with nothing to cancel
#: sends too: a hostile element on the gate's path (a proxy that stalls the
#: stream, a peer) that held the stream open and relayed nothing had the
#: gate deaf to every cancel order for good, its tools running on past
#: their cancel and the agent's abort recording them unacknowledged, even
#: once the path was honest again (rogue43U test). The control plane sends
#: every pending order again on a new stream, so a stalled stream costs a
#: gate at most this long; a gate with nothing in flight keeps its stream
#: (an order is only ever for a call it began, and a begin makes it busy).
#: A gate's ``cancel_watch_refresh`` (this, unless set shorter before
#: ``start``, as a test does) is what it uses.
CANCEL_WATCH_REFRESH = 15.0

# An asyncio call's begin on the gate's threads: one attempt, its retry
# waited on the caller's loop (rogue42I test).
_ONE_ATTEMPT = Retry(attempts=1)


class ToolGate(StreamFollower):
    """Stands in front of tools. For each call it has the control plane
    verify the capability token and the caller's node state and record the
    call; it follows the gate's cancel orders, setting the call's
    ``GateCall.cancelled`` event (and cancelling the asyncio task running
    it); and once the tool has returned it reports what the tool did: the
    cancel acknowledgement only when the cancellation stopped it (it left
    with CancelledError, or ToolCallCancelled from ``check()``), otherwise
    the end: completed when it returned, even after the order, failed when
    it raised its own error. A call stopped by a cancellation of its
    caller's (an asyncio task cancelled by something other than the gate)
    is acknowledged if the control plane has ordered its cancel by the time
    the gate reports, and failed otherwise.

    ``conn`` carries the tool server's own token (the gate reports as the
    tool layer, never as the agent whose call it gates); ``gate_id`` names
    the gate in the ledger. The caller's capability token is per call.
    """

    def __init__(self, conn: Conn, gate_id: str, *, never_ack: bool = False):
        super().__init__()
        self.conn = conn
        self.gate_id = gate_id
        #: Fault injection for tests and demos: a gate that ignores cancel
        #: orders and acknowledges no call, not even one its caller cancelled.
        self.never_ack = never_ack
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._inflight: dict[str, GateCall] = {}
        # Cancel orders that arrived before their call was registered here,
        # each with how many begins had started by then: an order can only
        # be for a call whose begin had started (the control plane orders
        # the cancel of a call it recorded), so it is dropped once those
        # begins have all settled. Orders for calls this gate never began
        # (a previous process's, or a hostile peer's made-up ids) are not
        # kept, and at most MAX_EARLY_ORDERS are held while begins are
        # always under way.
        self._orders: dict[str, tuple[str, int]] = {}
        self._begins = 0
        self._beginning: set[int] = set()
        self._threads: ThreadPoolExecutor | None = None  # GATE_THREADS, made on first use
        #: How long a busy gate keeps one WatchCancels stream
        #: (CANCEL_WATCH_REFRESH).
        self.cancel_watch_refresh = CANCEL_WATCH_REFRESH

    # -- cancel orders ----------------------------------------------------------

    def start(self) -> "ToolGate":
        """Starts following the gate's cancel orders (a daemon thread);
        ``ready`` is set once the stream is asked for (the control plane
        sends every pending order on a stream as it opens)."""
        if self._thread is None:
            self._stop.clear()
            self._follow_in_thread(self._watch, f"tether-gate-{self.gate_id}")
        return self

    def _watch(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            refreshed = threading.Event()
            done = threading.Event()
            refresher: threading.Thread | None = None

            def opening(stream: Any) -> None:
                # Kept, and refreshed while busy, from before it opens: a
                # path that withholds its headers holds a busy gate a
                # refresh interval at most, not the connection's timeout
                # (rogue44j test).
                nonlocal refresher
                self._stream = stream
                if self._stop.is_set():
                    stream.close()  # close() came first, and did not see it
                refresher = threading.Thread(target=self._refresh_while_busy, args=(stream, done, refreshed),
                                             name=f"tether-gate-{self.gate_id}-refresh", daemon=True)
                refresher.start()

            # Ready once the stream is asked for, as the Go gate's Ready and
            # the TypeScript gate's ready: it was set once a stream opened,
            # and a path that withheld its headers held a tool server
            # waiting on ``ready`` for as long (rogue44j test). A call begun
            # makes the gate busy, and a busy gate gives up a stream that
            # carries nothing at the refresh interval.
            self.ready.set()
            try:
                try:
                    stream = self.conn.stream("ToolService", "WatchCancels", {"gateId": self.gate_id}, opening=opening)
                    if self._stop.is_set():
                        stream.close()
                        return
                    backoff = 0.1
                    for order in stream:
                        if isinstance(order.get("callId"), str) and order["callId"]:
                            self._order(order["callId"], _clip_reason(order.get("reason", "")))
                finally:
                    done.set()
                    if refresher is not None:
                        refresher.join()
                if self._stop.is_set():
                    return
            except ConnectError as e:
                if not refreshed.is_set():
                    log.warning("tether: gate %s: cancel orders interrupted (%s); reconnecting", self.gate_id, e)
            except Exception as e:  # noqa: BLE001 — this thread is how the gate hears its cancel orders
                close_stream(self._stream)
                log.warning("tether: gate %s: cancel orders: an answer of the wrong shape (%s: %s); reconnecting", self.gate_id, e.__class__.__name__, e)
            if refreshed.is_set() and not self._stop.is_set():
                continue  # opened anew at once: the control plane sends every pending order again
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _refresh_while_busy(self, stream: Any, done: threading.Event, refreshed: threading.Event) -> None:
        """Closes stream (refreshed set) once it has lasted a refresh
        interval (``cancel_watch_refresh``) at a moment the gate has a call
        in flight or a begin under way; returns once done is set."""
        every = self.cancel_watch_refresh
        while not done.wait(every):
            with self._lock:
                busy = bool(self._inflight) or bool(self._beginning)
            if busy:
                refreshed.set()
                stream.close()
                return

    def _order(self, call_id: str, reason: str) -> None:
        if self.never_ack:
            return
        with self._lock:
            call = self._inflight.get(call_id)
            if call is not None:
                call._cancel(reason)
            elif self._beginning and len(self._orders) < MAX_EARLY_ORDERS and len(call_id.encode("utf-8", "replace")) <= _MAX_CALL_ID_BYTES:
                self._orders[call_id] = (reason, self._begins)

    @property
    def held_orders(self) -> int:
        """How many cancel orders the gate holds for calls it has not
        registered (yet)."""
        with self._lock:
            return len(self._orders)

    def _settled(self, n: int) -> None:
        """Settles the begin numbered n: drops the orders no begin still
        under way can be for. Called with the gate's lock held."""
        self._beginning.discard(n)
        oldest = min(self._beginning, default=None)
        for call_id in [c for c, (_, begun) in self._orders.items() if oldest is None or begun < oldest]:
            del self._orders[call_id]

    def _in_thread(self, fn: Callable[[], Any]) -> "asyncio.Future[Any]":
        """Runs fn, a call to the control plane of an asyncio call's, on one
        of the gate's own threads (GATE_THREADS), in a copy of the caller's
        context as ``asyncio.to_thread`` runs it, never on the loop's
        default executor, which the tools' blocking work shares."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=GATE_THREADS, thread_name_prefix=f"tether-gate-{self.gate_id}")
            threads = self._threads
        return asyncio.get_running_loop().run_in_executor(threads, contextvars.copy_context().run, fn)

    # -- calls --------------------------------------------------------------------

    def _call_timeout(self) -> float:
        """A begin's, an end's or an acknowledgement's timeout: 10 s, or the
        connection's when shorter."""
        timeout = self.conn.timeout
        return GATE_CALL_TIMEOUT if timeout is None or timeout <= 0 else min(GATE_CALL_TIMEOUT, timeout)

    def _begin(self, token: Token, tool: str, required_scope: str, *, retry: Retry | None = None) -> GateCall:
        try:
            tok = token() if callable(token) else token
        except ConnectError as e:
            # A token source asks the control plane for a fresh token (a
            # refresh, a sub-agent's spawn): its refusal of an agent being
            # stopped, or of a revoked grant, is the call's refusal, as
            # BeginCall's would be. Raised as it came, it escaped the
            # ToolRefused an agent catches to wait for its stop's signal,
            # and the agent died on its stop without confirming its exit.
            if e.code in (PERMISSION_DENIED, FAILED_PRECONDITION, UNAUTHENTICATED):
                raise ToolRefused(e.code, e.message, details=e.details) from None
            raise
        req = {"token": tok, "tool": tool, "gateId": self.gate_id}
        if required_scope:
            req["requiredScope"] = required_scope
        with self._lock:
            self._begins += 1
            n = self._begins
            self._beginning.add(n)
        try:
            try:
                resp = self.conn.call("ToolService", "BeginCall", req, timeout=self._call_timeout(), retry=retry)
            except ConnectError as e:
                if e.code in (PERMISSION_DENIED, FAILED_PRECONDITION, UNAUTHENTICATED):
                    raise ToolRefused(e.code, e.message, details=e.details) from None
                raise
            record = resp.get("call")
            if not isinstance(record, dict) or not isinstance(record.get("callId"), str) or not record["callId"]:
                # A proxy's, or a hostile peer's answer: no call to run or report.
                raise ConnectError(INTERNAL, "the control plane answered BeginCall without a call")
            if record.get("tool") != tool:
                # Another call's answer (the control plane records the tool
                # it is asked for): run under it, the block was recorded as
                # that call, whose end was already reported or is another
                # gate's (rogue45f test).
                raise ConnectError(INTERNAL, f"the control plane answered BeginCall of {tool[:128]!r} with a call of another tool")
            call = GateCall(self, record)
        except BaseException:
            with self._lock:
                self._settled(n)
            raise
        call._presented = tok if isinstance(tok, str) else ""
        call._begin_n = n  # settled once the call is registered, or ended abandoned
        return call

    def _register(self, call: GateCall) -> None:
        with self._lock:
            if call.call_id in self._inflight:
                # An answer naming a call this gate has in flight: the
                # control plane begins each call under an id of its own, so
                # it is another call's answer (a path that replays or
                # crosses answers). Run under it, the block's registration
                # replaced the other call and its end removed it, and its
                # EndCall recorded the other call ended while that call's
                # block ran on, deaf to its cancel (rogue45f test). The block
                # is not run and nothing is reported: the call this answer
                # should have named is unknown to the gate and stays in
                # flight in the ledger, as a call whose answer a path
                # withholds. The Go and TypeScript gates the same.
                self._settled(call._begin_n)
                raise ConnectError(INTERNAL, f"the control plane answered BeginCall with call {_clipped_id(call.call_id)}, "
                                             "which this gate has in flight")
            self._inflight[call.call_id] = call
            early = self._orders.pop(call.call_id, None)
            if early is not None:
                call._cancel(early[0])
            self._settled(call._begin_n)

    def _unregister(self, call: GateCall) -> None:
        with self._lock:
            call._active = False
            self._inflight.pop(call.call_id, None)

    def _finish(self, call: GateCall, error: BaseException | None, *, stopped: bool = False, ack_if_ordered: bool = False) -> None:
        """Reports how the call ended (the tool has returned by now): the
        acknowledgement if the cancel order stopped it, otherwise the end,
        completed or failed with ``error``. With ``ack_if_ordered`` (the call
        was stopped by a cancellation that did not come from an order the
        gate heard, e.g. the agent's run cancelled on its own abort signal,
        which can come first, or its caller left while it began) it
        acknowledges if the control plane has ordered the cancel (the call
        stopped after the order existed, and the abort waits for its
        acknowledgement), and otherwise reports the call failed: the control
        plane refuses the acknowledgement of a call with no order
        (failed_precondition). A ``never_ack`` gate acknowledges nothing."""
        if stopped or (ack_if_ordered and not self.never_ack):
            try:
                self.conn.call("ToolService", "CancelAck", {"callId": call.call_id, "gateId": self.gate_id}, timeout=self._call_timeout())
                return
            except ConnectError as e:
                if not ack_if_ordered or e.code != FAILED_PRECONDITION:
                    raise
        req: dict[str, Any] = {"callId": call.call_id, "gateId": self.gate_id}
        if error is not None:
            req["failed"] = True
            # The error may echo the agent's input: only UTF-8 is sent, or
            # the control plane would refuse the report and the call's end
            # would never be recorded.
            # It may echo the caller's capability token, too: the ledger
            # is read by every viewer, and the token is a bearer credential
            # for tools. It is cut out before the clip (which could leave
            # a usable piece).
            req["error"] = _wire.text(_redact(_error_text(error), call._presented)[:500])
        self.conn.call("ToolService", "EndCall", req, timeout=self._call_timeout())

    def _end_abandoned(self, call: GateCall) -> None:
        """Ends a call whose caller was cancelled while it began (not one
        whose answer named a call this gate has in flight: that call is
        another's, _register)."""
        with self._lock:
            self._settled(call._begin_n)
            if call.call_id in self._inflight:
                return
        try:
            self._finish(call, asyncio.CancelledError("the caller left before the tool ran"), ack_if_ordered=True)
        except ConnectError as e:
            log.warning("tether: gate %s: ending abandoned call %s failed (%s)", self.gate_id, call.call_id, e)

    def call(self, token: Token, tool: str, *, required_scope: str = "") -> "_GatedBlock":
        """A context manager (``with`` or ``async with``) around one call."""
        return _GatedBlock(self, token, tool, required_scope)

    def run(self, token: Token, tool: str, fn: Callable[..., Any], *args: Any, required_scope: str = "", **kwargs: Any) -> Any:
        """Runs ``fn(*args, **kwargs)`` as one recorded call. An fn that
        returns an awaitable (an async function) is refused with a
        TypeError, the call recorded failed: its work would come after the
        call was reported ended; use ``arun``."""
        with self.call(token, tool, required_scope=required_scope):
            return _done(fn(*args, **kwargs), "ToolGate.run")

    async def arun(self, token: Token, tool: str, fn: Callable[..., Any], *args: Any, required_scope: str = "", **kwargs: Any) -> Any:
        """Awaits ``fn(*args, **kwargs)`` as one recorded call; an abort
        cancels it."""
        async with self.call(token, tool, required_scope=required_scope):
            return await fn(*args, **kwargs)


def _done(result: Any, where: str) -> Any:
    """result, unless it is an awaitable or a generator: a synchronous gate
    reports the call ended once the function returned, and an awaitable's
    work (an async function's coroutine) or a generator's (its every step)
    would come after, outside the call, where no drain waits for it and no
    cancel order reaches it (rogue38K, rogue40H tests). A coroutine or a
    generator is closed unrun and the call recorded failed by the
    TypeError; another awaitable (a task already scheduled) cannot be
    stopped here, and is recorded failed all the same."""
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        if inspect.isgenerator(result):
            result.close()
        raise TypeError(f"{where}: the tool function returned a generator ({type(result).__name__}), whose steps would run "
                        "after the gate reported the call ended; gate the generator function itself (tool_gate on a def "
                        "that yields), or step it inside the call")
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"{where}: the tool function returned an awaitable ({type(result).__name__}), which would run after "
                        "the gate reported the call ended; await it inside the call (ToolGate.arun, or an async def under tool_gate)")
    return result


class _GatedBlock:
    """One call as a sync and async context manager."""

    def __init__(self, gate: ToolGate, token: Token, tool: str, required_scope: str):
        self.gate, self.token, self.tool, self.required_scope = gate, token, tool, required_scope
        self.call: GateCall | None = None
        self._ctx_token: contextvars.Token | None = None

    def __enter__(self) -> GateCall:
        self.call = self.gate._begin(self.token, self.tool, self.required_scope)
        self.gate._register(self.call)
        if self._cancelled_before_it_ran():
            self.gate._finish(self.call, None, stopped=True)
            raise ToolCallCancelled(self.call.call_id, self.call.reason)
        self._ctx_token = _current.set(self.call)
        return self.call

    def _cancelled_before_it_ran(self) -> bool:
        """Whether the control plane ordered the call's cancel before the
        tool ran: the order came before BeginCall's answer (an early order,
        applied as the call was registered). Such a call is taken out of the
        gate's calls in flight, and the caller acknowledges the cancel and
        raises ToolCallCancelled without running the block: run with
        ``cancelled`` already set, a tool that does its side effect before
        it looks (most never look) did it after its stop, and the ledger
        read the call completed (rogue43O tests), as the Go and TypeScript
        gates ran their handler or function until the forty-third pass."""
        call = self.call
        assert call is not None
        if not call.cancelled.is_set():
            return False
        self.gate._unregister(call)
        return True

    def _leave_context(self) -> None:
        """Takes the call back out of ``current_call()``'s context variable.
        A block may be left in another context than the one it was entered
        in: a generator holding the call open while it yields, stepped in a
        copy of its caller's context each time (``asyncio.to_thread(next,
        gen)``, a streaming server's ``iterate_in_threadpool``), or an
        asyncio generator its caller dropped mid-stream, closed by the
        loop's finalizer in a task of its own. The token cannot be reset
        there (ValueError), and raised, it left the call in flight for good,
        never reported (rogue40H tests); the variable is set back where it
        still names the call, and an ended call is no one's current call
        anyway."""
        token, self._ctx_token = self._ctx_token, None
        if token is None:
            return
        try:
            _current.reset(token)
        except (ValueError, RuntimeError):
            if _current.get() is self.call:
                _current.set(None if token.old_value is contextvars.Token.MISSING else token.old_value)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        call = self.call
        assert call is not None
        self._leave_context()
        self.gate._unregister(call)
        stopped = _stopped_by_cancel(call, exc)
        self.gate._finish(call, None if stopped else exc, stopped=stopped)
        if stopped and not isinstance(exc, ToolCallCancelled):
            raise ToolCallCancelled(call.call_id, call.reason) from exc
        return False

    async def __aenter__(self) -> GateCall:
        # A caller cancelled during the begin, which the control plane may
        # have recorded, must not leave the call in flight for nobody to
        # end: whichever of the begin's thread and this task comes second
        # ends it, without running the tool.
        lock = threading.Lock()
        left = False
        begun: list[GateCall] = []

        def begin() -> GateCall:
            call = self.gate._begin(self.token, self.tool, self.required_scope, retry=_ONE_ATTEMPT)
            with lock:
                if not left:
                    begun.append(call)
                    return call
            self.gate._end_abandoned(call)
            return call

        # A begin refused for the caller's lineage's spent rate budget is
        # sent again after the refusal's hint (the connection's Retry), the
        # hint waited here, on the caller's loop: waited on the gate's
        # thread, as a synchronous call waits on its caller's, a rogue that
        # spent its own lineage's budget held the threads every other
        # caller's begins and reports share, a few seconds a call, for as
        # long as it sent calls (rogue42I test).
        retry = self.gate.conn.retry
        timeout = self.gate._call_timeout()
        deadline = retry.clock() + timeout
        attempt = 1
        while True:
            try:
                self.call = await self.gate._in_thread(begin)
                break
            except asyncio.CancelledError:
                with lock:
                    left = True
                if begun:
                    threading.Thread(target=self.gate._end_abandoned, args=(begun[0],), daemon=True).start()
                raise
            except ConnectError as e:
                wait = retry.wait_after(e, attempt, deadline)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            attempt += 1
        # No await from here to the body: a cancel order is applied to this
        # task only while the body runs.
        self.call._loop = asyncio.get_running_loop()
        self.call._task = asyncio.current_task()
        self.gate._register(self.call)
        if self._cancelled_before_it_ran():
            # Unregistered before this task awaits: the gate's cancellation
            # of the task, scheduled as the order was applied, finds the
            # call no longer inside and is dropped.
            await asyncio.shield(self.gate._in_thread(functools.partial(self.gate._finish, self.call, None, stopped=True)))
            raise ToolCallCancelled(self.call.call_id, self.call.reason)
        self._ctx_token = _current.set(self.call)
        return self.call

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        call = self.call
        assert call is not None
        self._leave_context()
        self.gate._unregister(call)
        task = call._task
        if call._task_cancelled and task is not None and task is asyncio.current_task() and sys.version_info >= (3, 11):
            # The gate's own cancellation of the task: take it back (only
            # it: a cancellation from elsewhere stays) and raise
            # ToolCallCancelled instead.
            task.uncancel()
        stopped = _stopped_by_cancel(call, exc)
        cancelled_elsewhere = not stopped and isinstance(exc, asyncio.CancelledError)
        await asyncio.shield(self.gate._in_thread(functools.partial(
            self.gate._finish, call, None if stopped else exc, stopped=stopped, ack_if_ordered=cancelled_elsewhere)))
        if stopped and not isinstance(exc, ToolCallCancelled):
            raise ToolCallCancelled(call.call_id, call.reason) from None
        return False


#: Stands for the text of a tool's error that has none.
_NO_TEXT = "the tool failed with an error that has no text"


def _error_text(error: BaseException) -> str:
    """A tool's error as the gate reports it: its type's name and its text,
    or a placeholder for the text. Never raises: a tool that raises what
    its input (or an upstream's answer to it) says went wrong, as it came,
    raises what a rogue caller chose, an exception whose ``__str__`` raises
    or returns no text, and a gate that raised on describing it never
    reported the call's end (rogue40K test: the call in flight for good, a
    drain held to its deadline, the abort's cancel unacknowledged), as the
    Go and TypeScript gates record such a call failed."""
    try:
        name = type(error).__name__
    except Exception:  # noqa: BLE001 — a rogue metaclass
        name = "Exception"
    try:
        return f"{name}: {error}"
    except Exception:  # noqa: BLE001 — whatever the tool's __str__ raises
        return f"{name}: {_NO_TEXT}"


def _redact(text: str, token: str) -> str:
    """text without the capability token, or its signature (what makes a
    copy of it usable)."""
    return without_secret(text, token, "capability token")


def _stopped_by_cancel(call: GateCall, exc: BaseException | None) -> bool:
    """Whether the cancel order stopped the call: the tool left with the
    cancellation (CancelledError, or this call's ToolCallCancelled) after the
    order arrived. A tool that returned, or raised its own error, after the
    order ran to its end or failed on its own account: the ledger records
    that, never an acknowledgement."""
    if not call.cancelled.is_set():
        return False
    if isinstance(exc, ToolCallCancelled):
        return exc.call_id == call.call_id
    return isinstance(exc, asyncio.CancelledError)


def tool_gate(gate: ToolGate, tool: str, *, token: Token, required_scope: str = "") -> "_ToolGateSpec":
    """Gates a tool through ``gate``, presenting ``token`` (the calling
    agent's capability token, or a callable returning it).

    As a decorator, on a plain or an ``async def`` function::

        @tool_gate(gate, "search", token=grant_tokens)
        async def search(query: str) -> str: ...

    On a generator function (a streaming tool, plain or async), the call is
    held from the generator's first step until it ends or is closed.

    As a context manager, ``with`` or ``async with``::

        with tool_gate(gate, "search", token=tok) as call:
            for step in steps:
                call.check()  # raises ToolCallCancelled once cancelled
                ...

    A refused call raises ToolRefused without running the tool; a cancelled
    one raises ToolCallCancelled after the tool stopped and the cancel was
    acknowledged (on entry, the tool not run, when the cancel was ordered
    before the call began). An asyncio tool observes the cancellation as
    CancelledError; a synchronous one through ``current_call()`` (and stops
    by raising, with ``check()``). A tool that returns or raises its own
    error after the cancel is recorded completed or failed, and its caller
    gets what it returned or raised.
    """
    return _ToolGateSpec(gate, tool, token, required_scope)


class _ToolGateSpec:
    def __init__(self, gate: ToolGate, tool: str, token: Token, required_scope: str):
        self.gate, self.tool, self.token, self.required_scope = gate, tool, token, required_scope
        # The block each caller entered, per thread and asyncio task: one
        # spec used by concurrent callers (a tool server's requests) must
        # end each caller's own call, never another's on the first exit.
        self._blocks: contextvars.ContextVar[tuple[_GatedBlock, ...]] = contextvars.ContextVar(f"tether_gate_spec_{id(self)}", default=())
        # Every block entered and not yet left, whatever its context: a
        # block left in another context than it was entered in (a generator
        # holding the call while it yields, stepped in copies of its
        # caller's context) finds none there, and is this spec's only one
        # open when the spec serves one ``with`` (rogue40H test).
        self._open: list[_GatedBlock] = []
        self._open_lock = threading.Lock()

    def _push(self) -> _GatedBlock:
        block = self.gate.call(self.token, self.tool, required_scope=self.required_scope)
        self._blocks.set(self._blocks.get() + (block,))
        with self._open_lock:
            self._open.append(block)
        return block

    def _pop(self) -> _GatedBlock:
        blocks = self._blocks.get()
        with self._open_lock:
            # Blocks this context entered that another context has left.
            while blocks and not any(b is blocks[-1] for b in self._open):
                blocks = blocks[:-1]
            if blocks:
                block = blocks[-1]
                self._blocks.set(blocks[:-1])
            else:
                # Left in another context than entered: the open block, if
                # it is the only one; with several, which is unknown here.
                assert len(self._open) == 1, "tool_gate: exit without an enter in this thread or task"
                block = self._open[0]
            self._open.remove(block)
        return block

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        # A generator function (a streaming tool) holds its call from its
        # first step to its end, or its close: gated as a plain function,
        # the call was reported completed as it returned its generator, and
        # every step ran outside the call (rogue40H test).
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gated_generator(*args: Any, **kwargs: Any) -> Any:
                with self.gate.call(self.token, self.tool, required_scope=self.required_scope):
                    return (yield from fn(*args, **kwargs))

            return gated_generator

        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def gated_async_generator(*args: Any, **kwargs: Any) -> Any:
                async with self.gate.call(self.token, self.tool, required_scope=self.required_scope):
                    agen = fn(*args, **kwargs)
                    try:
                        async for item in agen:
                            yield item
                    finally:
                        await agen.aclose()

            return gated_async_generator

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def gated_async(*args: Any, **kwargs: Any) -> Any:
                async with self.gate.call(self.token, self.tool, required_scope=self.required_scope):
                    return await fn(*args, **kwargs)

            return gated_async

        @functools.wraps(fn)
        def gated(*args: Any, **kwargs: Any) -> Any:
            with self.gate.call(self.token, self.tool, required_scope=self.required_scope):
                return _done(fn(*args, **kwargs), "tool_gate")

        return gated

    def __enter__(self) -> GateCall:
        block = self._push()
        try:
            return block.__enter__()
        except BaseException:
            self._pop()
            raise

    def __exit__(self, *exc: Any) -> bool:
        return self._pop().__exit__(*exc)

    async def __aenter__(self) -> GateCall:
        block = self._push()
        try:
            return await block.__aenter__()
        except BaseException:
            self._pop()
            raise

    async def __aexit__(self, *exc: Any) -> bool:
        return await self._pop().__aexit__(*exc)
