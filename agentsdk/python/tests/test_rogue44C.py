"""The forty-fourth hostile pass on the SDK clients that page through the
control plane's answers (letter C), the Python SDK's part: a rogue path to
the control plane (a proxy, or a replica under a rogue's control: a relay
on loopback in front of the real server) forges the pages an honest
operator reads when it lists a rogue's subtree with list_subtree.

Before, list_subtree refused only a next page token equal to the one it
asked with: a path that answered an earlier page's token (two pages
pointing at each other) or a fresh token with every page kept it asking
for ever, and it took whatever a page held for its nodes (a text's
characters, more nodes than a page holds)."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from typing import Callable

import pytest

from helpers import LoopbackPeer, QuietHandler
from tether_agentsdk import Agent, ConnectError, Conn, agent as agent_module, list_subtree
from conftest import NO_RETRY

Forge = Callable[[int, dict, Callable[[], dict]], dict]


class ForgingPath(LoopbackPeer):
    """A relay in front of the real server that answers each ListNodes call
    as ``forge`` says (its number, the request, and a call of the real
    server), every other call relayed. Past ``limit`` ListNodes calls it
    refuses them unavailable: the test's own end of a listing that would
    not end."""

    def __init__(self, upstream: str, forge: Forge, limit: int):
        super().__init__()
        self.upstream = urllib.parse.urlsplit(upstream)
        self.lock = threading.Lock()
        self.calls = 0
        peer = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = self.read_body()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}

                def real() -> dict:
                    up = http.client.HTTPConnection(peer.upstream.hostname, peer.upstream.port, timeout=60)
                    try:
                        up.request("POST", self.path, body=body, headers=headers)
                        resp = up.getresponse()
                        return json.loads(resp.read())
                    finally:
                        up.close()

                if not self.path.endswith("/ListNodes"):
                    self.relay_answer(self.forward(peer.upstream, body))
                    return
                with peer.lock:
                    peer.calls += 1
                    n = peer.calls
                if n > limit:
                    self.answer_json({"code": "unavailable", "message": "stopped by the test"}, 503)
                    return
                self.answer_json(forge(n, json.loads(body), real))

        self.serve(Handler)


def _rogue_subtree(server, tree) -> str:
    """The tree's root with a rogue child that spawned 20 children: 22
    nodes, three pages of 8."""
    rogue = Agent.join(server.url, tree.root.spawn("rogue44c-rogue").credential)
    rogue.conn.call("AgentService", "SpawnBatch", {"parentNodeId": rogue.node_id, "children": [
        {"name": f"grandchild-{i:02d}"} for i in range(20)]})
    return tree.root.node_id


def _listing(server, path: ForgingPath, root: str) -> tuple[list | None, Exception | None]:
    try:
        return list_subtree(Conn(path.url, server.admin, retry=NO_RETRY), root, page_size=8), None
    except ConnectError as err:
        return None, err


def test_rogue44c_a_path_that_cycles_the_pages_ends_the_listing(server, tree):
    root = _rogue_subtree(server, tree)
    tokens: list[str] = []

    def forge(n: int, req: dict, real: Callable[[], dict]) -> dict:
        resp = real()
        if len(tokens) < 2:
            tokens.append(resp.get("nextPageToken", ""))
        elif req.get("pageToken") == tokens[1]:
            resp["nextPageToken"] = tokens[0]  # the third page names the second as the next
        return resp

    path = ForgingPath(server.url, forge, limit=200)
    try:
        nodes, err = _listing(server, path, root)
        assert err is not None and "already read" in err.message and path.calls <= 4, \
            f"list_subtree asked {path.calls} pages and ended with {err or f'{len(nodes)} nodes'}; " \
            "want an error at the 4th page, the token of the 2nd answered again"
    finally:
        path.close()


def test_rogue44c_a_path_that_answers_fresh_tokens_is_read_at_most_max_pages(server, tree, monkeypatch):
    root = _rogue_subtree(server, tree)
    # A bound of 200 answers (10,000 in use) keeps the relay's calls few;
    # before, list_subtree had none and read until the path's limit.
    monkeypatch.setattr(agent_module, "MAX_PAGES", 200, raising=False)

    def forge(n: int, req: dict, real: Callable[[], dict]) -> dict:
        return real() if n == 1 else {"nextPageToken": f"node-forged-{n}"}

    path = ForgingPath(server.url, forge, limit=300)
    try:
        nodes, err = _listing(server, path, root)
        assert err is not None and "MAX_PAGES" in err.message and path.calls <= 200, \
            f"list_subtree asked {path.calls} pages and ended with {err or f'{len(nodes)} nodes'}; " \
            "want an error after at most MAX_PAGES (200 here)"
    finally:
        path.close()


@pytest.mark.parametrize("page", [
    pytest.param(lambda n, real: {"nodes": "forged", "nextPageToken": ""}, id="nodes-a-text"),
    pytest.param(lambda n, real: {"nodes": real.get("nodes", [])[:1] * 9, "nextPageToken": ""}, id="nine-nodes-in-a-page-of-8"),
    pytest.param(lambda n, real: {"nodes": real.get("nodes", []), "nextPageToken": [n]}, id="token-a-list"),
])
def test_rogue44c_a_page_that_is_not_a_listing_is_refused(server, tree, page):
    root = _rogue_subtree(server, tree)
    path = ForgingPath(server.url, lambda n, req, real: page(n, real()), limit=10)
    try:
        nodes, err = _listing(server, path, root)
        assert err is not None and err.code == "internal", f"list_subtree took the forged page: {nodes!r:.200}"
    finally:
        path.close()
