"""The thirty-ninth hostile pass on the Python SDK's Verifier: a rogue that
delegates grants and revokes them in a loop (two requests of its lineage's
budget each) floods the revocation feed, and every feed message made the
verifier parse the drop time of every tombstone its set held. Its feed's
thread fell behind the feed (a revocation flood of N cost N²/2 parses) while
the verifier stayed fresh — freshness is when a message is applied — so an
operator's revocation of the rogue, queued behind the flood, reached the
verifier late. A tombstone's drop time is now read once, as it arrives."""

from __future__ import annotations

from datetime import datetime, timezone

from conftest import require_extra
from helpers import FloodingFeedPeer
from tether_agentsdk import Conn, _wire

_FLOOD = 400


def test_rogue39H_a_revocation_flood_costs_the_verifier_a_parse_per_tombstone_not_per_tombstone_held(monkeypatch):
    require_extra("cryptography")
    from tether_agentsdk import Verifier

    parses = [0]
    parse = _wire.parse_timestamp

    def counting(text):
        parses[0] += 1
        return parse(text)

    monkeypatch.setattr(_wire, "parse_timestamp", counting)
    peer = FloodingFeedPeer(_FLOOD)
    v = Verifier(Conn(peer.url, "rogue39h-token"), offline=True, staleness_budget=60)
    try:
        v.start()
        assert v.wait_for_sequence(_FLOOD, 60), f"the verifier applied {v.head} of {_FLOOD} messages"
        # One parse per tombstone the flood brought (and a few beside):
        # before, every message parsed every tombstone held, 80,200 for 400.
        assert parses[0] <= 2 * _FLOOD, f"{parses[0]} timestamps parsed for a flood of {_FLOOD} tombstones"
    finally:
        v.close()
        peer.close()


def test_rogue39H_the_set_still_drops_a_tombstone_after_its_drop_time_and_keeps_the_later_one():
    require_extra("cryptography")
    from tether_agentsdk import Verifier

    now = [1_000.0]
    v = Verifier(Conn("http://127.0.0.1:9", "rogue39h-token"), offline=True, clock=lambda: now[0])

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def feed(seq: int, *tombstones: tuple[str, float]) -> None:
        v._apply({"headSequence": str(seq), "tombstones": [
            {"grantId": gid, "sequence": str(seq), "dropAfter": at(drop)} for gid, drop in tombstones]})

    feed(1, ("g-early", 1_100.0), ("g-late", 5_000.0))
    # The same grant again, with a later drop time (a revocation whose
    # commit came later than its decision): the later one is kept, as the
    # Go and TypeScript verifiers keep it.
    feed(2, ("g-early", 1_100.0), ("g-again", 1_100.0))
    feed(3, ("g-again", 3_000.0))
    assert set(v._state.by_grant) == {"g-early", "g-late", "g-again"}
    now[0] = 1_200.0
    feed(4, ("g-new", 9_000.0))
    assert set(v._state.by_grant) == {"g-late", "g-again", "g-new"}, "a tombstone past its drop time was kept, or one before it dropped"
    now[0] = 4_000.0
    feed(5)
    assert set(v._state.by_grant) == {"g-late", "g-new"}
    now[0] = 9_500.0
    feed(6)
    assert set(v._state.by_grant) == set()
