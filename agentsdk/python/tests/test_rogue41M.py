"""The forty-first hostile pass on the Python SDK's Verifier: its key set.
The Go and TypeScript verifiers fetch the control plane's key set again
every five minutes; the Python one only after a token named a kid it did
not know. A key the control plane pruned from its ring (rotated out, and
dropped once the last token it could have signed expired, or rotated out
because it leaked) stayed in every Python verifier's key set until the tool
server restarted: a rogue holding that key (or a token it signed) minted
tokens a Python tool server verified for as long as it ran, where the Go
and TypeScript ones refused them within five minutes of the prune. The
Python verifier now fetches the key set again every five minutes too, when
its feed brings a message (the feed's heartbeat), on another thread."""

from __future__ import annotations

import base64
import json
import threading

from conftest import require_extra
from helpers import LoopbackPeer, QuietHandler, connect_envelope, wait_for
from tether_agentsdk import Conn


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class RotatingKeysPeer(LoopbackPeer):
    """A control plane whose key set the test changes (``keys``) and whose
    revocation feed sends a heartbeat whenever the test sets ``beat``;
    ``fetches`` counts the key set's fetches."""

    def __init__(self, keys: list[dict]):
        super().__init__()
        self.keys = keys
        self.fetches = 0
        self.beat = threading.Event()
        self.beats = 0
        peer = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                peer.fetches += 1
                self.answer_json({"keys": peer.keys})

            def do_POST(self):
                self.read_body()
                self.send_response(200)
                self.send_header("Content-Type", "application/connect+json")
                self.end_headers()
                try:
                    self.wfile.write(connect_envelope({"headSequence": "1"}))
                    self.wfile.flush()
                    while not peer.closing.is_set():
                        if peer.beat.wait(0.2):
                            peer.beat.clear()
                            peer.beats += 1
                            self.wfile.write(connect_envelope({"headSequence": "1"}))
                            self.wfile.flush()
                except OSError:
                    pass

        self.serve(Handler)


def test_rogue41M_a_key_pruned_from_the_ring_stops_verifying_within_the_refresh_interval():
    require_extra("cryptography")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from tether_agentsdk import TokenInvalid, Verifier

    def jwk(kid: str, private) -> dict:
        raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": _b64(raw), "alg": "EdDSA", "use": "sig"}

    leaked, successor = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    now = [1_000_000.0]
    header = _b64(json.dumps({"alg": "EdDSA", "kid": "k-leaked", "typ": "JWT"}).encode())
    claims = _b64(json.dumps({"iss": "tether", "sub": "n-rogue", "aud": "tether-tools", "jti": "g-rogue",
                              "scopes": ["tools:*"], "iat": int(now[0]), "nbf": int(now[0]),
                              "exp": int(now[0]) + 900}).encode())
    token = f"{header}.{claims}.{_b64(leaked.sign(f'{header}.{claims}'.encode()))}"

    peer = RotatingKeysPeer([jwk("k-leaked", leaked)])
    # The feed's age on a clock that barely moves (a microsecond a
    # reading): only the key set's refresh is timed here, on the verifier's
    # wall clock.
    ticks = [0.0]

    def monotonic() -> float:
        ticks[0] += 1e-6
        return ticks[0]

    v = Verifier(Conn(peer.url, "rogue41m-token"), offline=True, clock=lambda: now[0], monotonic=monotonic)
    try:
        v.start()
        assert v.ready.wait(20), "the verifier never heard the feed"
        assert v.verify(token).grant_id == "g-rogue"
        assert peer.fetches == 1

        # The control plane prunes the key: its key set names the
        # successor only. Five minutes pass on the verifier's clock and the
        # feed's heartbeat comes.
        peer.keys = [jwk("k-next", successor)]
        now[0] += 301
        peer.beat.set()
        wait_for("the key set fetched again after five minutes", lambda: peer.fetches >= 2)

        def refused() -> bool:
            try:
                v.verify(token)
            except TokenInvalid:
                return True
            return False

        wait_for("the pruned key's token refused", refused)
        # The refusal's unknown kid fetched it once more (rate-limited, as
        # before). Not on every message: a heartbeat within the five
        # minutes fetches nothing more.
        fetches = peer.fetches
        assert fetches == 3, f"{fetches} key-set fetches: at start, on schedule, after the unknown kid"
        synced = v._state.synced_at
        now[0] += 60
        peer.beat.set()
        wait_for("the next heartbeat applied", lambda: v._state.synced_at != synced)
        assert peer.fetches == fetches, f"{peer.fetches - fetches} key-set fetches within the refresh interval"
    finally:
        v.close()
        peer.close()
