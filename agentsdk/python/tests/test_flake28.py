"""A flake audit of the Python SDK: nothing is sent after a LeaseWorker's
close() returns."""

from __future__ import annotations

import threading

from tether_agentsdk import Conn, LeaseWorker
from tether_agentsdk.leaseworker import WorkerClosed


def _offer(operator: Conn, job: str, holder: str) -> dict:
    return operator.call("LeaseService", "Offer", {"jobId": job, "holderIdentity": holder, "leaseDuration": "30s"})["lease"]


def test_nothing_is_sent_after_close_returns(server, tree, tmp_path):
    # close() promises that the worker sends nothing after it (an agent
    # closes its worker, then claims its exit: a lease message after the
    # claim is kept as evidence against it). A send checked that the worker
    # was open and then sent; a close() between the two returned, and the
    # send went out after it. close() now waits (within its 10 s) for the
    # sends under way. Here the progress's send is held, once it found the
    # worker open, while close() runs on another thread: until close()
    # returns, or waits for that send.
    child = tree.root.spawn("worker")
    conn = Conn(server.url, child.credential)
    w = LeaseWorker(conn, str(tmp_path), renew_every=3600)
    job = w.accept(_offer(tree.operator, "py-flake28-close-" + child.node_id, child.node_id))
    decided = threading.Event()
    close_returned = threading.Event()
    await_sends = getattr(w, "_await_sends", None)
    if await_sends is not None:
        def waiting(deadline: float) -> None:
            decided.set()
            await_sends(deadline)

        w._await_sends = waiting
    real_call = conn.call
    closed_first: list[bool] = []

    def call(service, method, request, **kwargs):
        if method == "Progress" and not closed_first:
            def close() -> None:
                w.close()
                close_returned.set()
                decided.set()

            threading.Thread(target=close, daemon=True).start()
            assert decided.wait(60), "close() neither returned nor waited for the send"
            closed_first.append(close_returned.is_set())
        return real_call(service, method, request, **kwargs)

    conn.call = call
    try:
        try:
            job.progress("as the worker closes")
        except WorkerClosed:
            pass
        else:
            assert closed_first and not closed_first[0], "the progress was sent after the worker's close() had returned"
        assert close_returned.wait(30), "close() never returned"
    finally:
        w.close()
