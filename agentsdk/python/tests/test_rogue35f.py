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
from tether_agentsdk import Conn, FeedStale, Verifier


class _Feed:
    """A verifier on a manual monotonic clock following a server of its
    own, which the test kills."""

    def __init__(self, tether_bin, tmp_path):
        require_extra("cryptography")
        data = tmp_path / "data"
        data.mkdir()
        self.server = start_server(tether_bin, data)
        self.now = 1000.0
        self.verifier = Verifier(Conn(self.server.url, self.server.admin, retry=NO_RETRY),
                                 staleness_budget=10, monotonic=lambda: self.now)
        self.streams = 0
        self._lock = threading.Lock()
        stream = self.verifier.conn.stream

        def counted(*args, **kwargs):
            with self._lock:
                self.streams += 1
            return stream(*args, **kwargs)

        self.verifier.conn.stream = counted
        self.verifier.start()
        assert self.verifier.ready.wait(30)

    def kill(self) -> None:
        """Ends the feed for good: the verifier hears nothing more once it
        has tried another stream (the old one is over by then)."""
        with self._lock:
            before = self.streams
        self.server.stop()
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
