"""What both adapters share: a run's place in the agent tree."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, TypeVar

from .. import _wire
from .._connect import FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED, ConnectError
from ..agent import Aborted, Agent, Child, Grant, Signal
from ..toolgate import Token, ToolGate, ToolRefused

T = TypeVar("T")

log = logging.getLogger("tether_agentsdk")


class Node:
    """A node a framework's agent runs as: its grant's token for the gate.
    A child node is spawned lazily, on first use (a handoff taken, a
    subgraph entered), so a sub-agent the run never reaches leaves no node."""

    def __init__(self, token: Token | None = None, *, spawn: Callable[[], tuple[Child, Grant]] | None = None):
        self._token = token
        self._spawn = spawn
        self._lock = threading.Lock()
        self.child: Child | None = None
        self.grant: Grant | None = None
        # The child's own agent (its credential; never started: its calls
        # are made here), which spawns and delegates to its sub-agents.
        self.agent: Agent | None = None

    def ensure(self) -> None:
        with self._lock:
            if self._token is None and self._spawn is not None:
                self.child, self.grant = self._spawn()
                self._token = self.grant.token

    def token(self) -> str:
        self.ensure()
        tok = self._token
        assert tok is not None
        return tok() if callable(tok) else tok


def _end_unused(child: Child, conn: Any) -> None:
    """Ends a spawned child that will never run (its grant was refused), as
    a child process that exits does: its own session opened and closed, and
    its claim to have exited last. Left as it was, nobody confirmed its exit
    and the next termination's record counted the honest run's sub-agent
    unaccounted. Best effort: a child already stopped refuses it, and the
    refusal that brought us here is what the caller hears."""
    me = Agent(conn.with_token(child.credential), child.node)
    try:
        me.start()
        timeout = conn.timeout if conn.timeout and conn.timeout > 0 else 30.0
        if me.opened.wait(timeout):  # a bound on the wait, not a pause
            me.confirm_exit("never ran: its grant was refused")
    except Exception:  # noqa: BLE001 — the refusal being raised matters more
        log.warning("tether: could not end sub-agent %s, whose grant was refused", child.node_id, exc_info=True)
    finally:
        me.close()


class Subtree:
    """A run under one Tether agent (started: its signals followed) with its
    grant. ``gate`` is a ToolGate reporting with the tool layer's own token."""

    def __init__(self, agent: Agent, gate: ToolGate, token: Token, grant_id: str):
        self.agent = agent
        self.gate = gate
        self.root = Node(token)
        self.grant_id = grant_id
        self.children: list[tuple[Child, Grant]] = []
        self._lock = threading.Lock()

    def child_node(self, name: str, scopes: list[str], ttl: float | timedelta = 600, *, parent: Node | None = None) -> Node:
        """A child of ``parent`` (a node of this run: by default the run's
        agent), spawned when first used (after its parent), holding a grant
        delegated from the parent's with ``scopes`` (which the control
        plane refuses to widen) and ``ttl``, never past the parent grant's
        expiry. Until the forty-sixth pass every child was the run's
        agent's, its grant delegated from the run's: the agent a sub-agent
        handed off to ran beside it, not under it, and an operator's stop
        of the sub-agent (its drain, its abort, its grant's revocation) did
        not reach it (rogue46b tests), where the TypeScript adapter spawns
        it under the node that took the handoff (``TetherScope.child``)."""
        parent = self.root if parent is None else parent

        def spawn() -> tuple[Child, Grant]:
            if parent is self.root:
                me, grant_id, left = self.agent, self.grant_id, ttl
            else:
                parent.ensure()
                assert parent.agent is not None and parent.grant is not None
                me, grant_id, left = parent.agent, parent.grant.grant_id, _child_ttl(parent.grant, ttl)
            try:
                child = me.spawn(name, {"tether.dev/sub-agent": name})
                try:
                    grant = me.delegate(grant_id, child.node_id, scopes, ttl=left)
                except BaseException:
                    _end_unused(child, me.conn)
                    raise
            except ConnectError as e:
                # A sub-agent refused (its parent draining or aborting, a
                # grant revoked or too narrow) fails the run as a refused
                # tool call does: with ToolRefused, which the adapters raise
                # as themselves and an agent catches to wait for its stop.
                if e.code in (PERMISSION_DENIED, FAILED_PRECONDITION, UNAUTHENTICATED):
                    raise ToolRefused(e.code, e.message, details=e.details) from None
                raise
            node.agent = Agent(self.agent.conn.with_token(child.credential), child.node)
            with self._lock:
                self.children.append((child, grant))
            return child, grant

        node = Node(spawn=spawn)
        return node

    async def spawned(self, node: Node) -> None:
        """Awaits ``node.ensure()`` (a child node's lazy spawn: a subgraph
        entered, a handoff taken) on one of the gate's own threads, where
        its tools' calls present the node's token, never on the loop's
        default executor: there, behind the tools' blocking work, which a
        rogue whose input hangs it (a URL of a server that never answers)
        holds for as long as it likes, another agent's run in the process
        waited for its sub-agent, going nowhere (rogue42I test)."""
        await self.gate._in_thread(node.ensure)

    async def run_cancellable(self, make: Callable[[], Awaitable[T]]) -> T:
        """Runs ``make()`` as a task cancelled when the agent is aborted;
        raises Aborted then."""
        task = asyncio.ensure_future(make())
        self.agent.cancel_on_abort(task)
        try:
            return await task
        except asyncio.CancelledError:
            if self.agent.aborted.is_set() and task.cancelled():
                raise Aborted(self.agent.signal or Signal(abort=True)) from None
            raise


def _child_ttl(parent: Grant, ttl: float | timedelta) -> float | timedelta | None:
    """A child grant's lifetime, never past its parent grant's: the control
    plane refuses a delegation that outlives its parent, and none asks for
    the parent's own expiry. Without it every child of a child asked the
    ten minutes its parent's grant, delegated a moment before, did not have
    left, and was refused (the TypeScript ``TetherScope``'s childTtl)."""
    expires = _wire.parse_timestamp(parent.grant.get("expiresAt"))
    if expires is None:
        return ttl
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    return None if seconds >= (expires - datetime.now(timezone.utc)).total_seconds() else ttl


def name_of(obj: Any) -> str:
    return str(getattr(obj, "name", None) or getattr(obj, "__name__", None) or "tool")
