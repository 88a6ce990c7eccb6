"""The twenty-first hostile pass on the Python SDK's Verifier, as the Go and
TypeScript verifiers behave: a peer trickling a revocation message held the
feed, every check failing closed, for as long as it liked (the stream's
read timeout bounded each read's silence, not the wait for a message)."""

from __future__ import annotations

import json
import struct
import threading

from conftest import require_extra
from helpers import LoopbackPeer, QuietHandler
from tether_agentsdk import Conn


def _envelope(msg: dict) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data


class TricklingFeedPeer(LoopbackPeer):
    """Answers WatchRevocations with one whole message (the head), then the
    start of another that it trickles a byte at a time, each soon enough to
    beat the verifier's read timeout, for as long as the test runs; counts
    the streams opened. The key set is empty."""

    def __init__(self):
        super().__init__()
        self.watches = 0
        self.reopened = threading.Event()
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                self.answer_json({"keys": []})

            def do_POST(self):
                self.read_body()
                peer.watches += 1
                if peer.watches > 1:
                    peer.reopened.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.end_headers()
                try:
                    self.wfile.write(_envelope({"headSequence": "1"}))
                    self.wfile.write(struct.pack(">BI", 0, 1 << 10))  # a message of 1 KiB, to come
                    self.wfile.flush()
                    while not peer.closing.wait(0.05):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:
                    pass  # the verifier gave up

        self.serve(Handler)


def test_a_revocation_message_that_trickles_is_given_up_at_the_staleness_budget():
    # The stream's read timeout bounded each read: a peer trickling a
    # message held the feed (every check failing closed) for as long as it
    # liked, where the Go and TypeScript verifiers drop a stream with no
    # whole message for the budget and open another.
    require_extra("cryptography")
    from tether_agentsdk import Verifier

    peer = TricklingFeedPeer()
    v = Verifier(Conn(peer.url, "rogue21-token"), offline=True, staleness_budget=0.5)
    try:
        v.start()
        # A bound, not a timing: the verifier opens another stream once it
        # gave the first up, or never.
        assert peer.reopened.wait(30), "the verifier still reads a revocation message that never ends"
    finally:
        v.close()
        peer.close()
