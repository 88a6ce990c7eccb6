"""Verifier: offline with cryptography (JWKS + the revocation feed, failing
closed when stale), or through the control plane's Introspect."""

from __future__ import annotations

import base64
import json
import time

import pytest

from conftest import require_extra
from tether_agentsdk import FeedStale, GrantRevoked, ScopeNotGranted, TokenExpired, TokenInvalid, Verifier, allows
from tether_agentsdk import _wire

BUDGET = 10.0


def delegated(tree, name, scopes=("tool:search",)):
    child = tree.root.spawn(name)
    return child, tree.root.delegate(tree.root_grant_id, child.node_id, list(scopes), ttl=600)


def revoke(operator, grant_id: str) -> int:
    return _wire.uint64(operator.call("CapabilityService", "Revoke", {"grantId": grant_id, "reason": "test"})["sequence"])


class ManualMonotonic:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def offline(server):
    require_extra("cryptography")
    # Any reader may follow the feed: a viewer token.
    viewer = server.operator().call("AuthService", "CreateToken", {"role": "ROLE_VIEWER", "ttl": "3600s"})["token"]
    v = Verifier(server.operator().with_token(viewer), staleness_budget=BUDGET)
    assert v.offline and v.mode == "offline"
    with v:
        assert v.ready.wait(10), "the revocation feed's first message did not arrive"
        yield v


def test_offline_verification_and_a_revocation_within_the_feeds_latency(tree, offline):
    child, grant = delegated(tree, "worker")
    claims = offline.authorize(grant.token, "tool:search")
    assert claims.grant_id == grant.grant_id and claims.holder_node_id == child.node_id
    assert claims.chain == (tree.root_grant_id,)
    with pytest.raises(ScopeNotGranted):
        offline.authorize(grant.token, "tool:shell")

    revoked_at = time.monotonic()
    seq = revoke(tree.operator, grant.grant_id)
    # The feed pushes the tombstone: wait for it (bounded by the staleness
    # budget, the most a verifier may lag before failing closed anyway).
    assert offline.wait_for_sequence(seq, timeout=BUDGET), "the tombstone did not arrive within the budget"
    latency = time.monotonic() - revoked_at
    with pytest.raises(GrantRevoked):
        offline.verify(grant.token)
    assert latency < BUDGET


def test_revoking_an_ancestor_revokes_the_descendants_offline(tree, offline):
    # The child's grant derives from the root's: revoking the root's is
    # enough.
    _, grant = delegated(tree, "worker", ("tool:*",))
    offline.verify(grant.token)
    seq = revoke(tree.operator, tree.root_grant_id)
    assert offline.wait_for_sequence(seq, timeout=BUDGET)
    with pytest.raises(GrantRevoked, match="via ancestor"):
        offline.verify(grant.token)


def test_offline_verification_fails_closed_when_the_feed_is_stale(server, tree):
    require_extra("cryptography")
    _, grant = delegated(tree, "worker")
    clock = ManualMonotonic()
    v = Verifier(server.operator(), staleness_budget=BUDGET, monotonic=clock)
    with pytest.raises(FeedStale):
        v.verify(grant.token)  # never heard from the feed: closed
    with v:
        assert v.ready.wait(10)
        v.verify(grant.token)
        v.close()  # the feed stops arriving ...
        clock.now += BUDGET + 0.001  # ... and the budget passes
        with pytest.raises(FeedStale):
            v.verify(grant.token)


def test_offline_verification_refuses_forgeries(server, tree, offline):
    _, grant = delegated(tree, "worker")
    header, payload, sig = grant.token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["scopes"] = ["tool:*"]
    widened = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    for bad in (header + "." + widened + "." + sig, grant.token + "\n", grant.token[:-2], "a.b"):
        with pytest.raises(TokenInvalid) as e:
            offline.verify(bad)
        assert grant.token not in str(e.value)
    # An agent credential is not a capability token (another audience).
    with pytest.raises(TokenInvalid, match="audience"):
        offline.verify(tree.root.credential)
    none_alg = base64.urlsafe_b64encode(b'{"alg":"none","kid":"x"}').rstrip(b"=").decode()
    with pytest.raises(TokenInvalid, match="algorithm"):
        offline.verify(none_alg + "." + payload + ".")


def test_introspection_when_offline_is_not_possible(server, tree):
    # The fallback used without cryptography: every check asks the server.
    v = Verifier(server.operator(), offline=False).start()
    assert v.mode == "introspect"
    _, grant = delegated(tree, "worker")
    claims = v.authorize(grant.token, "tool:search")
    assert claims.grant_id == grant.grant_id
    with pytest.raises(ScopeNotGranted):
        v.authorize(grant.token, "tool:shell")
    revoke(tree.operator, grant.grant_id)
    with pytest.raises(GrantRevoked):
        v.verify(grant.token)
    with pytest.raises(TokenInvalid):
        v.verify("not-a-token")


def test_scope_rules_match_the_control_plane():
    assert allows(["tool:*"], "tool:shell")
    assert allows(["s3:read:bucket/*"], "s3:read:bucket/a/b.txt")
    assert not allows(["tool:*"], "tool")
    assert not allows(["tool:shell"], "tool:sh*")
    assert not allows(["tool:*"], "tool::x")
    assert not allows(["to*ol"], "toXol")


def test_a_token_is_expired_at_exp_plus_the_leeway_as_in_go_and_typescript(server, tree):
    # Go's and TypeScript's verifiers refuse a token from exp + leeway on
    # (now >= exp + leeway); the Python one used to accept it for that
    # instant (now > exp + leeway).
    require_extra("cryptography")
    _, grant = delegated(tree, "worker")
    exp = json.loads(base64.urlsafe_b64decode(grant.token.split(".")[1] + "=="))["exp"]
    wall = [float(exp)]
    v = Verifier(server.operator(), staleness_budget=BUDGET, leeway=5.0, clock=lambda: wall[0])
    with v:
        assert v.ready.wait(10)
        wall[0] = exp + 5.0 - 0.001
        v.verify(grant.token)
        wall[0] = exp + 5.0
        with pytest.raises(TokenExpired):
            v.verify(grant.token)
