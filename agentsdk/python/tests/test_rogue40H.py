"""The fortieth hostile pass on the Python SDK.

A gated block left in another context than the one it was entered in: a
streaming tool, a generator holding its call open while it yields, stepped
the way asyncio steps a blocking generator (``asyncio.to_thread(next, gen)``,
each step in a copy of the caller's context, as Starlette's
``iterate_in_threadpool`` does), or an asyncio generator whose caller hung
up mid-stream and which the loop's finalizer closes in a task of its own.
The block's exit reset the gate's context variable with a token of the
context it was entered in, which raised ValueError before the call was
reported: the call stayed in flight for good (a drain waited for it to its
deadline, the abort's cancel went unacknowledged, the tool server blamed),
and the gate kept it among its calls in flight. An agent hanging up on a
streaming tool left such a call each time. The Go gate records a call whose
handler panicked failed (rogue39a); this is the Python gate's road to the
same end.

An agent's ``close()`` (the end of ``with agent:``, ``confirm_exit``) returned
while the ``on_abort`` callbacks the abort had started still ran, on daemon
threads: an agent whose process ends with its ``with agent:`` block was cut
off in the middle of its cleanup (its subprocesses, its leases), and its
signals stream was closed, the control plane's witness of its exit, while
that cleanup went on. The Go SDK's ``Run`` waits for them since the
thirty-ninth pass (rogue39a); ``close()`` now does.

An agent took the node its signals stream's ``opened`` message carried as
its own, identity included: one such message of the wrong shape (a
proxy's, a hostile peer's: a node without its id) and every later
heartbeat and reconnect failed on the missing id, for good, the path
healthy again or not: the agent never heard its stop. The Go SDK keeps the
node id it was made with; so does the Python SDK now.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import pytest

from helpers import QuietHandler, LoopbackPeer, connect_envelope, terminate, wait_for
from tether_agentsdk import Agent, Conn, agent as agent_module, tool_gate


def child_grant(tree, name: str, scopes=("tool:stream",)):
    child = tree.root.spawn(name)
    return child, tree.root.delegate(tree.root_grant_id, child.node_id, list(scopes), ttl=600)


def open_calls(operator, node_id: str) -> list[dict]:
    return operator.call("ToolService", "ListCalls", {"nodeId": node_id}).get("calls", [])


@pytest.mark.parametrize("block", ["gate.call", "tool_gate"])
def test_rogue40H_a_streaming_tool_stepped_in_copies_of_its_callers_context_ends_its_call(server, tree, gate, block):
    child, grant = child_grant(tree, "streamer")

    def stream(n: int):
        with (gate.call(grant.token, "stream") if block == "gate.call" else tool_gate(gate, "stream", token=grant.token)):
            for i in range(n):
                yield f"chunk {i}"

    async def serve() -> list[str]:
        gen = stream(3)
        chunks: list[str] = []
        done = object()
        while (chunk := await asyncio.to_thread(next, gen, done)) is not done:
            chunks.append(chunk)
        return chunks

    outcome: object
    try:
        outcome = asyncio.run(serve())
    except BaseException as e:  # noqa: BLE001 — the test reads it
        outcome = e
    left = open_calls(tree.operator, child.node_id)
    assert outcome == ["chunk 0", "chunk 1", "chunk 2"] and left == [], (
        f"the stream ended with {outcome!r}, {len(left)} call(s) left in flight: {[c.get('state') for c in left]}")
    assert not gate._inflight, f"the gate holds {len(gate._inflight)} call(s) in flight"


def test_rogue40H_a_streaming_tool_its_caller_hung_up_on_ends_its_call(server, tree, gate):
    child, grant = child_grant(tree, "hung-up-on")
    started = []

    async def stream():
        async with gate.call(grant.token, "stream"):
            started.append(True)
            yield "chunk 0"
            await asyncio.Event().wait()  # more, which nobody reads
            yield "chunk 1"

    finalizers: list[object] = []

    async def main() -> None:
        gen = stream()
        assert await gen.__anext__() == "chunk 0"
        # The caller hangs up: the generator is dropped unfinished, and
        # the loop's finalizer closes it in a task of its own, which the
        # next turn of the loop creates.
        del gen
        gc.collect()
        await asyncio.sleep(0)
        others = asyncio.all_tasks() - {asyncio.current_task()}
        assert others, "the loop's finalizer started no task"
        finalizers.extend(await asyncio.gather(*others, return_exceptions=True))

    asyncio.run(main())
    assert started
    left = open_calls(tree.operator, child.node_id)
    assert left == [], (f"{len(left)} call(s) left in flight: {[c.get('state') for c in left]}; "
                        f"the finalizer's task ended with {finalizers!r}")
    assert not gate._inflight, f"the gate holds {len(gate._inflight)} call(s) in flight"


def joined(server, tree, name: str) -> Agent:
    child = tree.root.spawn(name)
    a = Agent.join(server.url, child.credential)
    a.heartbeat_every = 0.5
    return a


def test_rogue40H_close_waits_for_the_abort_callbacks_the_abort_started(server, tree, monkeypatch):
    worker = joined(server, tree, "rogue40h-cleanup")
    cleaning = threading.Event()
    release = threading.Event()
    cleaned: list[bool] = []

    def clean_up(_sig) -> None:
        cleaning.set()
        release.wait(30)  # a bound, should close never wait: the test fails then
        cleaned.append(release.is_set())

    # close() is told when it starts waiting for a callback still running:
    # only then is the cleanup let go on.
    monkeypatch.setattr(agent_module, "_close_waits_for_abort_callbacks", lambda a: release.set(), raising=False)
    worker.on_abort(clean_up)
    try:
        with worker:
            assert worker.opened.wait(10)
            terminate(tree.operator, worker.node_id, "abort")
            assert cleaning.wait(20), "the abort did not reach on_abort"
        # The process would end here.
        assert cleaned == [True], f"close() returned while on_abort ran (it had finished: {cleaned})"
    finally:
        release.set()


def test_rogue40H_an_abort_callback_that_confirms_the_exit_is_not_kept_waiting_for_itself(server, tree):
    worker = joined(server, tree, "rogue40h-exit-in-abort")
    claimed: list = []
    worker.on_abort(lambda _sig: claimed.append(worker.confirm_exit("aborted, cleaned up")))
    worker.start()
    try:
        assert worker.opened.wait(10)
        terminate(tree.operator, worker.node_id, "abort")
        wait_for("the exit claimed from on_abort", lambda: bool(claimed))
        node = tree.operator.call("AgentService", "GetNode", {"nodeId": worker.node_id})["node"]
        assert node.get("exitedAt"), node
    finally:
        worker.close()


def test_rogue40H_a_gated_generator_tool_holds_its_call_while_it_streams(server, tree, gate):
    # tool_gate on a generator function (sync or asyncio) reported the call
    # completed as the function returned its generator, before the tool
    # ran a step: the stream ran outside the call, where no drain waits for
    # it and no cancel order reaches it.
    child, grant = child_grant(tree, "generator-tool")
    seen: dict[str, list[int]] = {"sync": [], "async": []}

    @tool_gate(gate, "stream", token=grant.token)
    def stream_sync(n: int):
        for i in range(n):
            seen["sync"].append(len(open_calls(tree.operator, child.node_id)))
            yield i

    @tool_gate(gate, "stream", token=grant.token)
    async def stream_async(n: int):
        for i in range(n):
            seen["async"].append(await asyncio.to_thread(lambda: len(open_calls(tree.operator, child.node_id))))
            yield i

    async def read_async() -> list[int]:
        return [i async for i in stream_async(2)]

    assert list(stream_sync(2)) == [0, 1]
    assert asyncio.run(read_async()) == [0, 1]
    assert seen == {"sync": [1, 1], "async": [1, 1]}, f"calls in flight while each step ran: {seen}"
    assert open_calls(tree.operator, child.node_id) == []

    # Left early (the caller stops reading), the call ends all the same.
    gen = stream_sync(5)
    assert next(gen) == 0
    gen.close()
    assert open_calls(tree.operator, child.node_id) == [] and not gate._inflight


def test_rogue40H_a_sync_gate_refuses_a_tool_function_that_returns_a_generator(server, tree, gate):
    child, grant = child_grant(tree, "generator-returned")
    ran: list[str] = []

    def stream():
        ran.append("step")
        yield "chunk"

    for how, run in (("run", lambda: gate.run(grant.token, "stream", stream)),
                     ("tool_gate", lambda: tool_gate(gate, "stream", token=grant.token)(lambda: stream())())):
        with pytest.raises(TypeError) as e:
            run()
        assert "generator" in str(e.value), (how, str(e.value))
    assert ran == [], "a step of the generator ran outside its call"
    assert open_calls(tree.operator, child.node_id) == []


class _MangledOpenedPeer(LoopbackPeer):
    """A control plane behind a path gone wrong once: the first signals
    stream opens with a node without its id (or another node's), then
    ends; every later one opens with the agent's node and carries an
    abort. Heartbeats are answered empty, and counted. A request naming
    another node is refused permission_denied, as the control plane
    refuses a credential another node's request."""

    def __init__(self, node_id: str, first_node: dict):
        super().__init__()
        self.streams = 0
        self.heartbeats = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                if body[:1] == b"\x00":  # a stream's request: one envelope
                    body = body[5:]
                named = json.loads(body or b"{}").get("nodeId")
                method = self.path.rsplit("/", 1)[-1]
                if named != node_id:
                    self.answer_json({"code": "permission_denied", "message": "not your node"}, 403)
                    return
                if method == "Heartbeat":
                    peer.heartbeats += 1
                    self.answer_json({})
                    return
                if method != "WatchSignals":
                    self.answer_json({})
                    return
                peer.streams += 1
                first = peer.streams == 1
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.end_headers()
                node = first_node if first else {"nodeId": node_id, "name": "worker"}
                body = connect_envelope({"opened": {"node": node}})
                if not first:
                    body += connect_envelope({"signal": {"kind": "SIGNAL_KIND_ABORT", "reason": "stopped"}})
                self.wfile.write(body)
                self.wfile.flush()
                if not first:
                    peer.closing.wait()
                self.close_connection = True

        self.serve(Handler)


@pytest.mark.parametrize("first_node", [{"name": "worker"}, {"nodeId": "n-someone-else", "name": "other"}], ids=["no-id", "another-id"])
def test_rogue40H_one_opened_message_of_the_wrong_shape_does_not_deafen_the_agent(first_node):
    peer = _MangledOpenedPeer("n-rogue40h", first_node)
    worker = Agent(Conn(peer.url, "a-credential"), {"nodeId": "n-rogue40h", "name": "worker"})
    worker.heartbeat_every = 0.2
    try:
        worker.start()
        wait_for("the abort on the stream after the wrong one", worker.aborted.is_set, timeout=15)
        assert worker.signal is not None and worker.signal.reason == "stopped", f"aborted by {worker.signal}, not the peer's abort"
        assert worker.node_id == "n-rogue40h" and worker.node.get("nodeId") == "n-rogue40h", worker.node
    except AssertionError as e:
        raise AssertionError(f"{e}: {peer.streams} signals stream(s) opened, {peer.heartbeats} heartbeat(s) sent") from None
    finally:
        worker.close()
        peer.close()
