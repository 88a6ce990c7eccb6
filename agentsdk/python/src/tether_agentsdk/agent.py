"""Agent: one node of the agent tree, its credential, and the signals the
control plane sends it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from . import _wire
from ._connect import FAILED_PRECONDITION, INTERNAL, PERMISSION_DENIED, UNAUTHENTICATED, ConnectError, Conn, Retry, close_stream, compact_jws

log = logging.getLogger("tether_agentsdk")

#: Set by tests only: called with the agent when close() starts waiting
#: for an on_abort callback still running on another thread.
_close_waits_for_abort_callbacks: Callable[["Agent"], None] | None = None

DRAIN = "SIGNAL_KIND_DRAIN"
ABORT = "SIGNAL_KIND_ABORT"


#: The most answers list_subtree follows ``nextPageToken`` through: at the
#: server's largest pages 10 million nodes, far past what a caller holds in
#: memory (a caller of a larger subtree pages it itself, from the last token
#: it read). A path that answers a fresh token with every page is read no
#: further. The Go SDK's ``agentsdk.MaxPages``, the TypeScript SDK's
#: ``MaxPages``.
MAX_PAGES = 10_000


def list_subtree(conn: Conn, root_node_id: str = "", label_selector: str = "", *, page_size: int = 0,
                 page_token: str = "") -> list[dict]:
    """Lists a subtree whole (the calling agent's own when no root is
    named), matching label_selector, depth first with each node's children
    in id order, a page at a time: it asks for the subtree's pages
    (``ListNodes`` with ``subtreePages``, page_size nodes read a call, the
    server's 1,000 at most and by default) and follows their
    ``nextPageToken`` to the end. ``ListNodes`` with a root and without
    ``subtreePages`` answers the subtree in one message, which a rogue in it
    makes larger than the connection reads (16 MiB: about 3,800 nodes
    carrying every label allowed, fewer as JSON) simply by spawning, so that
    its parent's or an operator's listing of it fails; each page here is
    bounded however large the subtree grew. Each page is its own snapshot,
    and each is a request of the caller's rate budget. The Go SDK's
    ``agentsdk.ListSubtree``, the TypeScript SDK's ``listSubtree``.

    A page the control plane never answers raises ConnectError
    (``internal``): one that is not a ``ListNodes`` answer (its nodes not a
    list of objects, its token not text), one of more nodes than page_size
    (or 1,000), a ``nextPageToken`` answered before (the control plane's
    continuation always moves on: a path to it, a rogue proxy or replica,
    that repeats, alternates or cycles its pages would be read for ever), a
    listing past MAX_PAGES answers."""
    most = page_size if 0 < page_size < 1000 else 1000
    out: list[dict] = []
    token = page_token
    seen = {hashlib.sha256(token.encode()).digest()} if token else set()
    pages = 0
    while True:
        resp = conn.call("AgentService", "ListNodes", {"rootNodeId": root_node_id, "labelSelector": label_selector,
                                                       "pageSize": page_size, "pageToken": token, "subtreePages": True})
        pages += 1
        nodes, nxt = resp.get("nodes", []), resp.get("nextPageToken", "")
        if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes) or not isinstance(nxt, str):
            raise ConnectError(INTERNAL, f"list_subtree: answer {pages} is not a ListNodes answer")
        if len(nodes) > most:
            raise ConnectError(INTERNAL, f"list_subtree: a page of {len(nodes)} nodes, where the control plane's hold at most {most}")
        out.extend(nodes)
        if not nxt:
            return out
        # A continuation that does not move on (the page asked for, or any
        # earlier one) would be asked for for ever.
        key = hashlib.sha256(nxt.encode()).digest()
        if key in seen:
            raise ConnectError(INTERNAL, f"list_subtree: answer {pages} named a page already read as the next "
                                         "(the control plane's pages always move on: a path to it repeats or cycles them)")
        if pages >= MAX_PAGES:
            raise ConnectError(INTERNAL, f"list_subtree: still a next page after {pages} answers (MAX_PAGES); "
                                         "read the rest a page at a time")
        seen.add(key)
        token = nxt


@dataclass(frozen=True)
class Signal:
    """A drain or abort order from the control plane. Drain: finish what is
    in flight, start nothing new, then exit. Abort: stop now.

    ``deadline``, on a drain, is when the stop next acts on its own, on the
    control plane's clock (None: the signal carried none): while it drains,
    the end of its drain window (the calls still in flight are then
    cancelled, the agent aborted); once the drain ended (every call ended,
    at once for an agent with none) and its grants were revoked, the end of
    its wait for the exit (the record is then written and the credential
    refused). The control plane's, read from the stop it holds: the agent
    stretches nothing by it. A stop's first drain signal may come before it
    set one (a later one carries it), and a stop that takes the node over
    sends its own (``Agent.drain_deadline`` follows them). The abort may
    come sooner."""

    abort: bool
    termination_id: str = ""
    reason: str = ""
    deadline: datetime | None = None

    @classmethod
    def from_json(cls, m: dict) -> "Signal":
        return cls(
            abort=m.get("kind") == ABORT,
            termination_id=m.get("terminationId", ""),
            reason=m.get("reason", ""),
            deadline=_wire.parse_timestamp(m.get("deadline")),
        )


class Aborted(Exception):
    """The control plane aborted the agent (or its credential was refused)."""

    def __init__(self, signal: Signal):
        super().__init__(f"aborted by the control plane: {signal.reason}" if signal.reason else "aborted by the control plane")
        self.signal = signal


@dataclass
class Child:
    """A spawned child: its node and the credential to hand to the child's
    process (which calls Agent.join). Its repr does not show the
    credential: a framework logging the child showed it to whoever reads
    the logs."""

    node: dict
    credential: str = field(repr=False)

    @property
    def node_id(self) -> str:
        return self.node["nodeId"]


@dataclass
class Grant:
    """A capability grant with its current token (what the agent shows a
    tool; never its credential). Its repr does not show the token."""

    grant: dict
    token: str = field(repr=False)
    expires_at: datetime | None

    @property
    def grant_id(self) -> str:
        return self.grant["grantId"]

    @property
    def scopes(self) -> list[str]:
        return list(self.grant.get("scopes", []))

    @classmethod
    def from_json(cls, m: dict) -> "Grant":
        return cls(grant=m.get("grant", {}), token=m.get("token", ""), expires_at=_wire.parse_timestamp(m.get("tokenExpiresAt")))


class Agent:
    """One agent node: its credential, its signals, and the calls it makes as
    itself. ``start()`` (or ``with agent:``) follows the signal stream and
    sends heartbeats, which also bring a fresh credential before the old one
    expires. An agent never holds its own kill switch: it can only propose
    its own stop.

    Signals surface as ``draining`` and ``aborted`` (threading.Event),
    ``on_drain``/``on_abort`` callbacks, and for asyncio code
    ``await wait_draining()``, ``await wait_aborted()``,
    ``draining_event()``/``aborted_event()`` and ``cancel_on_abort(task)``.
    An abort implies a drain.
    """

    #: Seconds between heartbeats (each also re-reads the node's signal, so
    #: a signal stream that broke silently costs at most one period).
    heartbeat_every: float = 5.0

    def __init__(self, conn: Conn, node: dict):
        self.conn = conn
        self.node = node
        # Its identity, for good (the Go SDK's Agent.id): a signals
        # stream's opened message refreshes ``node`` only when it names
        # this node (rogue40H test).
        self._node_id: str = node["nodeId"]
        self.draining = threading.Event()
        self.aborted = threading.Event()
        self.opened = threading.Event()
        self.signal: Signal | None = None
        self._drain_deadline: datetime | None = None
        self._lock = threading.Lock()
        self._on_drain: list[Callable[[Signal], Any]] = []
        self._on_abort: list[Callable[[Signal], Any]] = []
        # The SDK's own telling of asyncio code (cancel_on_abort, the loop
        # events): run at once as the signal is noted, as the Go SDK ends
        # Agent.Context, never behind the agent's callbacks, one of which
        # may wait (rogue43H tests). Each only schedules on its loop.
        self._drain_hooks: list[Callable[[Signal], None]] = []
        self._abort_hooks: list[Callable[[Signal], None]] = []
        # The on_abort runs going on (under _lock): an abort's run of its
        # callbacks, or one registered after it; of these, per thread, how
        # many have started there. close() waits until none runs but on
        # its own thread.
        self._abort_running = 0
        self._abort_running_on: dict[int, int] = {}
        self._abort_idle = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream = None
        self.credential_expires_at: datetime | None = None
        self.run_error: ConnectError | None = None

    # -- joining the tree ---------------------------------------------------

    @classmethod
    def register_root(cls, operator: Conn, name: str, labels: dict[str, str] | None = None) -> "Agent":
        """Registers a root agent with an operator connection and returns it,
        connected with its own credential."""
        resp = operator.call("AgentService", "RegisterRoot", {"name": name, "labels": labels or {}})
        a = cls(operator.with_token(resp["credential"]), resp["node"])
        a.credential_expires_at = _wire.parse_timestamp(resp.get("credentialExpiresAt"))
        return a

    @classmethod
    def join(cls, base_url: str, credential: str, *, timeout: float = 30.0, retry: Retry | None = None) -> "Agent":
        """Connects a spawned child's process with the credential its parent
        handed over (retry: its connection's, Conn's)."""
        conn = Conn(base_url, credential, timeout=timeout, retry=retry)
        who = conn.call("AuthService", "WhoAmI", {})
        if not who.get("nodeId"):
            raise ValueError("Agent.join needs an agent credential, not an operator token")
        node = conn.call("AgentService", "GetNode", {"nodeId": who["nodeId"]})["node"]
        return cls(conn, node)

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def credential(self) -> str:
        return self.conn.token

    def spawn(self, name: str, labels: dict[str, str] | None = None) -> Child:
        """Registers a child under this agent. Refused (failed_precondition)
        once the agent is draining or aborting."""
        resp = self.conn.call("AgentService", "Spawn", {"parentNodeId": self.node_id, "name": name, "labels": labels or {}})
        return Child(node=resp["node"], credential=resp["credential"])

    def delegate(self, parent_grant_id: str, child_node_id: str, scopes: list[str], ttl: float | timedelta | None = None) -> Grant:
        """Derives a narrower grant from one this agent holds, for a node in
        its subtree."""
        req: dict[str, Any] = {"parentGrantId": parent_grant_id, "holderNodeId": child_node_id, "scopes": list(scopes)}
        if ttl:
            req["ttl"] = _wire.duration(ttl)
        return Grant.from_json(self.conn.call("CapabilityService", "Delegate", req))

    def refresh_token(self, grant_id: str) -> Grant:
        """A fresh short-lived token for a grant this agent holds; the control
        plane re-checks the whole chain first."""
        return Grant.from_json(self.conn.call("CapabilityService", "Refresh", {"grantId": grant_id}))

    def token_source(self, grant: Grant, *, refresh_when_left: float = 1 / 3) -> "TokenSource":
        """A callable returning the grant's token, refreshed once less than
        ``refresh_when_left`` of its life is left. Pass it where a token is
        needed (``tool_gate(..., token=source)``)."""
        return TokenSource(self, grant, refresh_when_left)

    def confirm_exit(self, reason: str = "") -> dict:
        """Claims that this agent's process is exiting; call it last. It first
        stops sending heartbeats and following signals, then (when it had
        started them) opens a session of its own and ends it, so that the
        control plane sees a session of the agent end after its last
        heartbeat and nothing after the claim: the record counts the claim
        only then (anything the agent sends after it is refused and
        contradicts it). Its signals stream may have broken before (a
        restart, a cut path) with a heartbeat landing after its end and its
        reconnect not through: that end alone, which the agent outlived,
        witnesses nothing. A launcher's confirmation from outside the
        process is an attestation, stronger evidence."""
        was_running = bool(self._threads)
        self.close()
        if was_running and self.run_error is None:
            self._end_a_session()
        return self.conn.call("AgentService", "ConfirmExit", {"nodeId": self.node_id, "reason": reason})["node"]

    def _end_a_session(self) -> None:
        """Opens a signals stream, waits until the control plane says it is
        open (it stored the session) and closes it: a session end the
        control plane sees after every heartbeat the agent sent. Best
        effort: a failure is logged, and the claim weighed without it."""
        try:
            with self.conn.stream("AgentService", "WatchSignals", {"nodeId": self.node_id}, read_timeout=self.conn.timeout) as stream:
                for msg in stream:
                    if "opened" in msg:
                        return
        except Exception as e:  # noqa: BLE001 — the claim is made all the same
            log.warning("tether: could not end a session before the exit claim (%s: %s); the record may count the claim unaccounted",
                        e.__class__.__name__, e)

    def propose_stop(self, condition: str, reason: str = "") -> dict:
        """Proposes this agent's own stop; the control plane decides."""
        return self.conn.call("AgentService", "ProposeStop", {"nodeId": self.node_id, "condition": condition, "reason": reason})["proposal"]

    def report_ready(self) -> dict:
        return self.conn.call("AgentService", "ReportReady", {"nodeId": self.node_id})["node"]

    # -- signals --------------------------------------------------------------

    def on_drain(self, callback: Callable[[Signal], Any]) -> None:
        """Runs ``callback(signal)`` once when a drain (or abort) arrives, on
        a thread of the SDK's (the drain's callbacks on one, in the order
        registered: one may wait for the work in flight, or call
        confirm_exit), or at once, on the caller's thread, if it already
        has."""
        self._once(self.draining, self._on_drain, callback)

    def on_abort(self, callback: Callable[[Signal], Any]) -> None:
        """Runs ``callback(signal)`` once when an abort arrives, on a thread
        of the SDK's (the abort's callbacks on one, in the order registered,
        beside the drain's), or at once, on the caller's thread, if it
        already has. ``close()`` (and so ``confirm_exit`` and the end of
        ``with agent:``) returns once they have returned."""
        self._once(self.aborted, self._on_abort, callback, abort=True)

    def _once(self, arrived: threading.Event, waiting: list, callback: Callable[[Signal], Any], *, abort: bool = False) -> None:
        """Runs ``callback(signal)`` now if ``arrived`` is set, else queues it
        in ``waiting``, which ``_handle`` runs when the signal arrives."""
        with self._lock:
            fired = self.signal if arrived.is_set() else None
            if fired is None:
                waiting.append(callback)
            elif abort:
                self._abort_running += 1
        if fired is not None:
            if not abort:
                callback(fired)
                return
            self._abort_run_started()
            try:
                callback(fired)
            finally:
                self._abort_run_returned()

    def _hook(self, arrived: threading.Event, hooks: list, hook: Callable[[Signal], None]) -> Callable[[], None]:
        """Runs ``hook(signal)`` (one that only schedules work on a loop,
        never waits) now if ``arrived`` is set, else as ``_handle`` notes
        the signal, before any callback runs; returns what takes it back
        unrun (a task that ended, a wait given up), so that hooks do not
        pile up on an agent that runs for long."""
        with self._lock:
            fired = self.signal if arrived.is_set() else None
            if fired is None:
                hooks.append(hook)
        if fired is not None:
            hook(fired)

        def remove() -> None:
            with self._lock:
                try:
                    hooks.remove(hook)
                except ValueError:
                    pass  # it ran, or was taken back

        return remove

    @staticmethod
    def _run_hooks(hooks: list, sig: Signal) -> None:
        for hook in hooks:
            try:
                hook(sig)
            except Exception:
                log.exception("tether: a signal hook failed")

    def _abort_run_started(self) -> None:
        """Notes that an on_abort run, counted in _abort_running, has
        started on this thread."""
        me = threading.get_ident()
        with self._lock:
            self._abort_running_on[me] = self._abort_running_on.get(me, 0) + 1

    def _abort_run_returned(self) -> None:
        me = threading.get_ident()
        with self._lock:
            self._abort_running -= 1
            left = self._abort_running_on.get(me, 0) - 1
            if left > 0:
                self._abort_running_on[me] = left
            else:
                self._abort_running_on.pop(me, None)
            self._abort_idle.notify_all()

    def _run_abort_callbacks(self, callbacks: list, sig: Signal) -> None:
        self._abort_run_started()
        try:
            self._run_callbacks(callbacks, sig)
        finally:
            self._abort_run_returned()

    def _wait_abort_callbacks(self) -> None:
        """Waits until no on_abort callback runs, but on this thread (one
        that closes the agent, or claims its exit, from on_abort)."""
        me = threading.get_ident()

        def others() -> int:
            return self._abort_running - self._abort_running_on.get(me, 0)

        with self._lock:
            if not others():
                return
        hook = _close_waits_for_abort_callbacks
        if hook is not None:
            hook(self)
        with self._lock:
            self._abort_idle.wait_for(lambda: not others())

    @property
    def drain_deadline(self) -> datetime | None:
        """The deadline of the drain the agent is under, as its latest drain
        signal gave it (``Signal.deadline``; None: none yet, or that signal
        carried none), on the control plane's clock: a stop that takes the
        node over (an operator's drain over its parent's) sends its own."""
        with self._lock:
            return self._drain_deadline

    def _handle(self, sig: Signal) -> None:
        drain_callbacks: list = []
        abort_callbacks: list = []
        hooks: list = []
        with self._lock:
            if not sig.abort:
                # Every drain signal, not only the first: a stop that takes
                # the node over drains it on its own deadline, earlier or
                # later (rogue37a test).
                self._drain_deadline = sig.deadline
            if not self.draining.is_set():
                self.signal = sig
                self.draining.set()
                drain_callbacks, self._on_drain = self._on_drain, []
                hooks, self._drain_hooks = self._drain_hooks, []
            if sig.abort and not self.aborted.is_set():
                self.signal = sig
                self.aborted.set()
                abort_callbacks, self._on_abort = self._on_abort, []
                hooks, self._abort_hooks = hooks + self._abort_hooks, []
                if abort_callbacks:
                    self._abort_running += 1  # close() waits for the run
        # The SDK's own hooks first, here: queued behind the agent's
        # callbacks, a callback registered before them that waited (a
        # cleanup hung on a tool server that never answers, an on_drain
        # waiting for the work in flight) held them, and the run was never
        # cancelled on its abort, nor told of its drain (rogue43H tests).
        self._run_hooks(hooks, sig)
        # On threads of their own (the drain's on one, the abort's on
        # another, each in the order registered), as the Go SDK's: run on
        # the thread that heard the signal, a callback that waited (for the
        # work in flight) held it, and when that was the heartbeats' no
        # heartbeat went out and the credential was not refreshed meanwhile
        # (rogue37a test).
        for which, callbacks, run in (("drain", drain_callbacks, self._run_callbacks), ("abort", abort_callbacks, self._run_abort_callbacks)):
            if callbacks:
                threading.Thread(target=run, args=(callbacks, sig),
                                 name=f"tether-on-{which}-{self.node_id}", daemon=True).start()

    @staticmethod
    def _run_callbacks(callbacks: list, sig: Signal) -> None:
        for cb in callbacks:
            try:
                cb(sig)
            except Exception:
                log.exception("tether: a signal callback failed")

    def check(self) -> None:
        """Raises Aborted once the agent is aborted: a cheap check between
        steps of synchronous work."""
        if self.aborted.is_set():
            raise Aborted(self.signal or Signal(abort=True))

    def _loop_event(self, which: threading.Event, hooks: list) -> tuple[asyncio.Event, Callable[[], None]]:
        """An asyncio.Event of the running loop set when ``which`` is, and
        what stops it being set (a wait given up)."""
        loop = asyncio.get_running_loop()
        ev = asyncio.Event()

        def fire(_: Signal) -> None:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass  # the loop is closed

        return ev, self._hook(which, hooks, fire)

    def draining_event(self) -> asyncio.Event:
        """An asyncio.Event of the running loop, set on drain or abort (at
        once as the signal is noted, before the on_drain callbacks run)."""
        return self._loop_event(self.draining, self._drain_hooks)[0]

    def aborted_event(self) -> asyncio.Event:
        """An asyncio.Event of the running loop, set on abort (at once as
        the signal is noted, before the on_abort callbacks run)."""
        return self._loop_event(self.aborted, self._abort_hooks)[0]

    async def wait_draining(self) -> Signal:
        ev, remove = self._loop_event(self.draining, self._drain_hooks)
        try:
            await ev.wait()
        finally:
            remove()
        assert self.signal is not None
        return self.signal

    async def wait_aborted(self) -> Signal:
        ev, remove = self._loop_event(self.aborted, self._abort_hooks)
        try:
            await ev.wait()
        finally:
            remove()
        assert self.signal is not None
        return self.signal

    def cancel_on_abort(self, task: asyncio.Task) -> None:
        """Cancels ``task`` (on its own loop) when the agent is aborted: at
        once as the abort is noted, before the on_abort callbacks run (one
        of them may wait), as the Go SDK ends ``Agent.Context``. Forgotten
        once the task is done."""
        loop = task.get_loop()

        def fire(sig: Signal) -> None:
            try:
                loop.call_soon_threadsafe(task.cancel, f"tether: {sig.reason or 'aborted'}")
            except RuntimeError:
                pass

        remove = self._hook(self.aborted, self._abort_hooks, fire)
        try:
            loop.call_soon_threadsafe(task.add_done_callback, lambda _: remove())
        except RuntimeError:
            remove()  # the loop is closed: the task will never run again

    # -- the session ------------------------------------------------------------

    def start(self) -> "Agent":
        """Follows the signal stream and sends heartbeats in two daemon
        threads until close(). Returns self."""
        if self._threads:
            return self
        self._stop.clear()
        for target, name in ((self._watch, "signals"), (self._beat, "heartbeat")):
            t = threading.Thread(target=target, name=f"tether-{name}-{self.node_id}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        """Waits until no ``on_abort`` callback runs (but on the calling
        thread: one may close the agent, or claim its exit), then stops
        sending heartbeats, then following signals. The callbacks first:
        they are the agent's cleanup after an abort (its subprocesses, its
        leases), which a process ending once close() returns (the end of
        ``with agent:``) cut off in the middle, and which may still need the
        credential the heartbeats refresh; and the signals stream's end is
        the control plane's witness of the agent's exit (rogue40H test, as
        the Go SDK's ``Run`` waits for them). Then the heartbeats before the
        stream: the control plane counts the stream's end as witness only
        when it saw nothing of the agent after it, so a heartbeat in flight
        must land before the stream ends. A callback that never returns
        holds close() as long."""
        self._wait_abort_callbacks()
        self._stop.set()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me and t.name.startswith("tether-heartbeat-"):
                t.join(timeout=10)
        stream = self._stream
        if stream is not None:
            stream.close()
        for t in self._threads:
            if t is not me:
                t.join(timeout=10)
        self._threads = []
        # Those an abort heard meanwhile started.
        self._wait_abort_callbacks()
        # Its idle keep-alive connections: the control plane counts them
        # against the lineage's until its idle timeout closes them.
        self.conn.close()

    def __enter__(self) -> "Agent":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Agent":
        return self.start()

    async def __aexit__(self, *exc: Any) -> None:
        # On a thread of its own, not the loop's default executor
        # (``asyncio.to_thread``): the few threads (``min(32, cores + 4)``)
        # the tools' blocking work shares, which a rogue whose input hangs
        # that work holds for as long as it likes. Waiting there, an agent
        # whose work had ended never closed: its heartbeats went on and its
        # signals stream, the control plane's witness of its exit, stayed
        # open (rogue42I test).
        own = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tether-close-{self.node_id}")
        try:
            await asyncio.get_running_loop().run_in_executor(own, self.close)
        finally:
            own.shutdown(wait=False)

    def _credential_dead(self, err: ConnectError) -> bool:
        if err.code not in (UNAUTHENTICATED, PERMISSION_DENIED, FAILED_PRECONDITION):
            return False
        # Nothing to reconnect to (the node was terminated): make sure work
        # stops, as the control plane has already stopped listening. A
        # failed_precondition is a node whose exit was confirmed (a
        # launcher's attestation while the agent was cut off): the control
        # plane refuses its every session and heartbeat, before the "stop
        # now" it signals such a node, so the refusal is that signal.
        # Retried, each refusal was stored as evidence against the exit, and
        # the agent's work was never told to stop.
        self.run_error = err
        reason = "the node's exit was confirmed: stop now" if err.code == FAILED_PRECONDITION else f"credential rejected: {err.code}"
        self._handle(Signal(abort=True, reason=reason))
        self._stop.set()
        return True

    def _watch(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                # Kept before it opens: close() ends an open that hangs (a
                # reconnect lost on a dead path) rather than wait on it.
                stream = self.conn.stream("AgentService", "WatchSignals", {"nodeId": self.node_id}, opening=self._keep_stream)
                if self._stop.is_set():
                    stream.close()
                    return
                for msg in stream:
                    if "opened" in msg:
                        # The node as the control plane stored it, when the
                        # message names this node: taken whole, one of the
                        # wrong shape (a proxy's, a hostile peer's) without
                        # its id failed every later heartbeat and reconnect
                        # for good, and one naming another node had the
                        # agent ask as that node and take the refusal for
                        # its own stop (rogue40H test).
                        opened = msg["opened"]
                        node = opened.get("node") if isinstance(opened, dict) else None
                        if isinstance(node, dict) and node.get("nodeId") == self._node_id:
                            self.node = node
                        self.opened.set()
                        backoff = 0.1
                    elif "signal" in msg:
                        self._handle(Signal.from_json(msg["signal"]))
                if self._stop.is_set():
                    return
            except ConnectError as e:
                if self._stop.is_set():
                    return  # close() ended the stream, or its open
                if self._credential_dead(e):
                    return
                log.warning("tether: signal stream interrupted (%s); reconnecting", e)
            except Exception as e:  # noqa: BLE001 — this thread is how the agent hears its stop
                # A message of the wrong shape (a proxy's, or a hostile
                # peer's): the stream is broken, as the Go and TypeScript
                # SDKs' decoders say; the thread must not end on it, or no
                # later stop would be heard.
                close_stream(self._stream)
                log.warning("tether: signal stream: an answer of the wrong shape (%s: %s); reconnecting", e.__class__.__name__, e)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _keep_stream(self, stream: Any) -> None:
        self._stream = stream
        if self._stop.is_set():
            stream.close()  # close() came first, and did not see it

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                resp = self.conn.call("AgentService", "Heartbeat", {"nodeId": self.node_id, "sentAt": _wire.timestamp(datetime.now(timezone.utc))})
                cred = resp.get("credential")
                if cred:
                    self._refreshed(cred)
                if resp.get("signal"):
                    self._handle(Signal.from_json(resp["signal"]))
            except ConnectError as e:
                if self._credential_dead(e):
                    return
                log.warning("tether: heartbeat failed: %s", e)
            except Exception as e:  # noqa: BLE001 — an answer of the wrong shape must not end the heartbeats
                log.warning("tether: heartbeat: an answer of the wrong shape (%s: %s)", e.__class__.__name__, e)
            self._stop.wait(self.heartbeat_every)

    def _refreshed(self, cred: Any) -> None:
        """Takes the refreshed credential a heartbeat's answer carries, when
        it has a credential's shape: a compact JWS within MAX_TOKEN_BYTES,
        as the Go and TypeScript agents take. One of the wrong shape (a
        proxy's, a hostile peer's) is not taken, the agent's own kept: not
        text, it failed every later heartbeat and reconnect before they left
        the process, for good, and the agent never heard its stop; text a
        header cannot carry, the SDK refused its own next call
        unauthenticated and aborted the agent itself, as for a dead
        credential the control plane never refused (rogue41G test). Until
        the forty-fourth pass any bearer token a header can carry was taken:
        a character outside a JWS's alphabet, or past the 8 KiB the control
        plane parses, and the control plane refused the next call
        unauthenticated, the agent aborting itself; past its 64 KiB of
        headers, every later heartbeat and reconnect failed there, for good,
        the agent deaf to its stop (rogue44j test)."""
        token = cred.get("credential") if isinstance(cred, dict) else None
        if not token:
            return
        if not compact_jws(token):
            log.warning("tether: heartbeat: the answer's refreshed credential is not of a credential's shape (%s); the agent keeps its own",
                        type(token).__name__)
            return
        try:
            expires = _wire.parse_timestamp(cred.get("expiresAt"))
        except (TypeError, ValueError):
            expires = None
        self.conn.set_token(token)
        self.credential_expires_at = expires

    def __repr__(self) -> str:
        return f"Agent({self.node.get('name', '')!r}, {self.node_id})"


@dataclass
class TokenSource:
    """The current token of a grant, refreshed before it expires. Calling it
    returns a token with more than ``refresh_when_left`` of its life left
    (refreshing first when needed); safe from any thread."""

    agent: Agent
    grant: Grant
    refresh_when_left: float = 1 / 3
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _issued: datetime = field(default_factory=lambda: datetime.now(timezone.utc), repr=False)

    def __call__(self) -> str:
        with self._lock:
            now = datetime.now(timezone.utc)
            exp = self.grant.expires_at
            if exp is not None:
                life = max((exp - self._issued).total_seconds(), 1.0)
                if (exp - now).total_seconds() < life * self.refresh_when_left:
                    self.grant = self.agent.refresh_token(self.grant.grant_id)
                    self._issued = now
            return self.grant.token
