"""The thirty-fifth hostile pass on the Python SDK's Verifier: the feed's
age was the injected ``monotonic`` clock's now minus the last message's
arrival, so a clock that stepped back (an NTP step, a VM resumed) took the
step off the age of a feed that had died, and a rogue's revoked token,
whose revocation the dead feed never carried, passed for as long. The age
now adds up the clock's forward steps only, and a clock behind the feed's
last message fails closed."""

from __future__ import annotations

import threading

import pytest

from conftest import NO_RETRY, require_extra, start_server
from helpers import wait_for
from tether_agentsdk import Agent, Conn, ConnectError, FeedStale, Verifier


class _Feed:
    """A verifier on a manual monotonic clock following a server of its
    own, which the test kills."""

    def __init__(self, tether_bin, tmp_path, refuse_first_keys: bool = False):
        require_extra("cryptography")
        data = tmp_path / "data"
        data.mkdir()
        self.server = start_server(tether_bin, data)
        self.now = 1000.0
        self.verifier = Verifier(Conn(self.server.url, self.server.admin, retry=NO_RETRY),
                                 staleness_budget=10, monotonic=lambda: self.now)
        self.streams = 0
        self.dead = False
        self._lock = threading.Lock()
        stream = self.verifier.conn.stream

        def counted(*args, **kwargs):
            with self._lock:
                self.streams += 1
                if self.dead:
                    raise ConnectError("unavailable", "the feed is cut")
            return stream(*args, **kwargs)

        self.verifier.conn.stream = counted
        # The key set's fetches: the first refused when refuse_first_keys
        # (the verifier starts knowing no key); one made while hold is set
        # reads the control plane's answer whole, then waits for release
        # before the verifier is given it (a slow answer).
        self.keys_fetched = 0
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()
        get = self.verifier.conn.get

        def keys(path, **kwargs):
            self.keys_fetched += 1
            if self.keys_fetched == 1 and refuse_first_keys:
                raise ConnectionError("the key set is not reachable yet")
            body = get(path, **kwargs)
            if self.hold:
                self.held.set()
                self.release.wait(60)
            return body

        self.verifier.conn.get = keys
        self.verifier.start()
        assert self.verifier.ready.wait(30)

    def kill(self) -> None:
        """Ends the feed for good, the control plane left running: its
        stream is cut and no other opens. The verifier hears nothing more
        once it has tried another stream (the old one is over by then)."""
        with self._lock:
            before = self.streams
            self.dead = True
        self.verifier._stream.close()
        wait_for("the verifier's feed ended and reopened", lambda: self.streams > before)

    def close(self) -> None:
        self.verifier.close()
        self.server.stop()


@pytest.fixture
def feed(tether_bin, tmp_path):
    f = _Feed(tether_bin, tmp_path)
    yield f
    f.close()


def test_rogue35f_a_clock_set_back_does_not_shorten_the_feeds_age(feed):
    feed.kill()
    feed.now += 8
    feed.verifier.fresh()  # 8 s, within the budget of 10
    feed.now -= 5  # the clock set back
    feed.verifier.fresh()  # still 8 s of the clock's ticking
    feed.now += 5
    with pytest.raises(FeedStale):
        feed.verifier.fresh()  # 13 s of ticking since the feed died


def test_rogue35f_a_clock_set_back_past_the_last_message_fails_closed(feed):
    feed.kill()
    feed.now -= 3600
    feed.now += 10.001
    with pytest.raises(FeedStale):
        feed.verifier.fresh()


def test_rogue35f_a_live_feed_is_fresh_again_after_a_step_back(feed):
    feed.now -= 3600
    def fresh() -> bool:
        try:
            feed.verifier.fresh()
            return True
        except FeedStale:
            return False
    wait_for("the verifier fresh at the feed's next message", fresh)


def test_rogue35f_b_a_slow_key_set_answer_does_not_outlast_the_feed(tether_bin, tmp_path):
    """A key the verifier does not know yet signs the rogue's token (its
    first fetch of the key set failed), so the check fetches the key set,
    and the answer is slow. Meanwhile the rogue's grant is revoked and the
    feed dies, unheard, and the budget passes. The check had looked at the
    feed's freshness before the fetch only, and accepted the revoked token
    once the key set came; it looks again where the tombstones are."""
    f = _Feed(tether_bin, tmp_path, refuse_first_keys=True)
    try:
        op = f.server.operator()
        rogue = Agent.register_root(op, "rogue")
        x = op.call("CapabilityService", "IssueRoot", {"holderNodeId": rogue.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        f.hold = True
        checked: list[BaseException | None] = []

        def check() -> None:
            try:
                f.verifier.verify(x["token"])
                checked.append(None)
            except BaseException as e:  # noqa: BLE001 — the test reads what it was
                checked.append(e)

        t = threading.Thread(target=check)
        t.start()
        assert f.held.wait(30)  # the check waits for the key set's answer
        f.kill()
        op.call("CapabilityService", "Revoke", {"grantId": x["grant"]["grantId"], "reason": "rogue"})  # unheard
        f.now += 10.001
        f.release.set()
        t.join(30)
        assert checked and isinstance(checked[0], FeedStale), f"the rogue's revoked token across a slow key-set answer: {checked}"
    finally:
        f.release.set()
        f.close()


def test_rogue35f_c_printed_objects_carry_no_secret(server):
    """What a framework logs of the SDK's objects is read by whoever reads
    the logs, a rogue among them: the repr of a spawned Child showed the
    credential its process joins with, and a Grant's (and so a
    TokenSource's) its capability token. They now show neither."""
    op = server.operator()
    parent = Agent.register_root(op, "parent")
    try:
        child = parent.spawn("child")
        root = op.call("CapabilityService", "IssueRoot", {"holderNodeId": parent.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
        grant = parent.refresh_token(root["grant"]["grantId"])
        source = parent.token_source(grant)
        secrets = {"the child's credential": child.credential, "the grant's token": grant.token, "the agent's credential": parent.credential}
        for obj in (child, grant, source, parent, parent.conn):
            for shown in (repr(obj), str(obj), f"{obj!r}"):
                for name, secret in secrets.items():
                    assert secret not in shown and secret.rsplit(".", 1)[-1] not in shown, f"{type(obj).__name__} printed carries {name}"
    finally:
        parent.close()
