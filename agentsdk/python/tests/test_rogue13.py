"""A rogue agent (and its rogue inputs) against a tool server that uses the
Python SDK's ToolGate and Verifier, through the real server."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
import hmac
import http.server
import json
import threading
import uuid

import pytest

from conftest import require_extra
from helpers import terminate, wait_for
from tether_agentsdk import ConnectError, GrantRevoked, ScopeNotGranted, TokenExpired, TokenInvalid, Verifier, tool_gate
from tether_agentsdk import _wire

BUDGET = 10.0


@pytest.fixture
def offline(server):
    require_extra("cryptography")
    viewer = server.operator().call("AuthService", "CreateToken", {"role": "ROLE_VIEWER", "ttl": "3600s"})["token"]
    v = Verifier(server.operator().with_token(viewer), staleness_budget=BUDGET)
    with v:
        assert v.ready.wait(10), "the revocation feed's first message did not arrive"
        yield v


def child_grant(tree, name: str, scopes=("tool:search",)):
    child = tree.root.spawn(name)
    return child, tree.root.delegate(tree.root_grant_id, child.node_id, list(scopes), ttl=600)


def open_calls(operator, node_id: str) -> set[str]:
    return {c["callId"] for c in operator.call("ToolService", "ListCalls", {"nodeId": node_id}).get("calls", [])}


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def parts(token: str) -> tuple[dict, str]:
    h, p, _ = token.split(".")
    return json.loads(base64.urlsafe_b64decode(h + "=" * (-len(h) % 4))), p


# -- the gate ------------------------------------------------------------------------


def test_a_shared_tool_gate_context_manager_ends_each_callers_own_call(server, tree, gate):
    # One tool_gate(...) spec used as a context manager by concurrent
    # requests (the token a callable that reads the request's agent): a
    # rogue's request that leaves first must end its own call, never the
    # other agent's, which is still running.
    rogue, rogue_grant = child_grant(tree, "rogue")
    honest, honest_grant = child_grant(tree, "honest")
    current_token: contextvars.ContextVar[str] = contextvars.ContextVar("token")
    spec = tool_gate(gate, "search", token=lambda: current_token.get())

    async def main() -> None:
        rogue_in, honest_in, rogue_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def rogue_request() -> None:
            current_token.set(rogue_grant.token)
            async with spec:
                rogue_in.set()
                await honest_in.wait()
            rogue_out.set()

        async def honest_request() -> None:
            await rogue_in.wait()
            current_token.set(honest_grant.token)
            async with spec:
                honest_in.set()
                await rogue_out.wait()
                # The rogue has left: its call is ended, this one is not.
                assert open_calls(tree.operator, rogue.node_id) == set(), "the rogue's call was left in flight"
                assert len(open_calls(tree.operator, honest.node_id)) == 1, "the honest call was ended on the rogue's exit"

        await asyncio.gather(rogue_request(), honest_request())

    asyncio.run(main())
    assert open_calls(tree.operator, honest.node_id) == set()


def test_a_tool_error_echoing_the_token_does_not_put_it_in_the_ledger(server, tree, gate):
    _, grant = child_grant(tree, "echo")
    recorded: list[dict] = []
    call = gate.conn.call

    def spy(service, method, req, *a, **kw):  # observes the real server's answers
        resp = call(service, method, req, *a, **kw)
        if method == "EndCall":
            recorded.append(resp["call"])
        return resp

    gate.conn.call = spy

    def tool():
        raise RuntimeError(f"cannot parse request with capability {grant.token} from the agent")

    with pytest.raises(RuntimeError):
        gate.run(grant.token, "search", tool)
    assert recorded and recorded[0]["resolution"].endswith("FAILED")
    err = recorded[0].get("error", "")
    assert "cannot parse request" in err
    # Not the token, nor any piece of it the clip could leave.
    assert grant.token not in err and grant.token.split(".")[2][:16] not in err


def test_the_gate_keeps_no_shared_limit_a_rogue_could_fill(server, tree, gate):
    # The server charges BeginCall by lineage; the gate itself must not
    # refuse others once a rogue's calls are open.
    _, rogue_grant = child_grant(tree, "rogue")
    _, honest_grant = child_grant(tree, "honest")
    blocks = [gate.call(rogue_grant.token, "search") for _ in range(20)]
    for b in blocks:
        b.__enter__()
    try:
        assert gate.run(honest_grant.token, "search", lambda: "ok") == "ok"
    finally:
        for b in blocks:
            b.__exit__(None, None, None)


def test_no_one_but_the_gate_that_began_a_call_ends_or_acknowledges_it(server, tree, gate):
    # The rogue agent holds the call's id (the record names it) and its own
    # credential; another tool server has a tool-server token of its own.
    other_name = "rogue13-other-" + uuid.uuid4().hex[:8]
    other = server.tool_server(other_name)
    with gate.call(tree.root_token, "search") as call:
        for conn, gate_id in ((tree.root.conn, gate.gate_id), (other, other_name), (other, gate.gate_id)):
            for method in ("EndCall", "CancelAck"):
                with pytest.raises(ConnectError) as e:
                    conn.call("ToolService", method, {"callId": call.call_id, "gateId": gate_id})
                assert e.value.code in ("permission_denied", "not_found", "failed_precondition"), e.value
                assert tree.root_token not in str(e.value)
        assert call.call_id in open_calls(tree.operator, tree.root.node_id), "a rogue ended the call"
    assert call.call_id not in open_calls(tree.operator, tree.root.node_id)
    # Ending it twice (a retry, or a tool server told to rewrite it): the
    # record keeps the first end.
    again = gate.conn.call("ToolService", "EndCall", {"callId": call.call_id, "gateId": gate.gate_id, "failed": True, "error": "rewritten"})["call"]
    assert again["resolution"].endswith("COMPLETED") and not again.get("error"), again


# -- the verifier -------------------------------------------------------------------


def test_alg_none_and_hs256_with_the_public_key_are_refused(tree, offline):
    _, grant = child_grant(tree, "rogue")
    header, payload = parts(grant.token)
    none = b64(json.dumps({"alg": "none", "kid": header["kid"]}).encode()) + "." + payload + "."
    with pytest.raises(TokenInvalid, match="algorithm"):
        offline.verify(none)
    jwks = json.loads(_fetch_jwks(offline))
    x = next(k["x"] for k in jwks["keys"] if k["kid"] == header["kid"])
    for secret in (x.encode(), base64.urlsafe_b64decode(x + "=")):
        h = b64(json.dumps({"alg": "HS256", "kid": header["kid"], "typ": "JWT"}).encode())
        sig = b64(hmac.new(secret, f"{h}.{payload}".encode(), hashlib.sha256).digest())
        with pytest.raises(TokenInvalid, match="algorithm"):
            offline.verify(f"{h}.{payload}.{sig}")


def _jwks_path() -> str:
    return "/.well-known/jwks.json"


def _fetch_jwks(v: Verifier) -> bytes:
    import urllib.request

    with urllib.request.urlopen(v.conn.base_url + _jwks_path(), timeout=10) as r:
        return r.read()


def test_a_rogue_key_named_by_jku_or_x5u_is_never_fetched(tree, offline):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    x = b64(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            body = json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "rogue-kid", "x": x}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rogue_url = f"http://127.0.0.1:{srv.server_address[1]}/jwks.json"
        _, grant = child_grant(tree, "rogue", ("tool:*",))
        _, payload = parts(grant.token)
        for extra in ({"jku": rogue_url}, {"x5u": rogue_url}, {"jwk": {"kty": "OKP", "crv": "Ed25519", "x": x}}):
            h = b64(json.dumps({"alg": "EdDSA", "kid": "rogue-kid", **extra}).encode())
            sig = b64(key.sign(f"{h}.{payload}".encode()))
            with pytest.raises(TokenInvalid, match="unknown key"):
                offline.verify(f"{h}.{payload}.{sig}")
        assert hits == []
    finally:
        srv.shutdown()
        srv.server_close()


def test_expired_and_not_yet_valid_tokens_are_refused(tree, offline):
    _, grant = child_grant(tree, "rogue")
    now = offline.clock()
    offline.clock = lambda: now + 3600
    with pytest.raises(TokenExpired):
        offline.verify(grant.token)
    offline.clock = lambda: now - 3600
    with pytest.raises(TokenInvalid, match="not valid yet"):
        offline.verify(grant.token)


def test_scopes_wider_than_the_grant_are_refused(tree, offline):
    _, grant = child_grant(tree, "rogue", ("tool:search",))
    for wider in ("tool:*", "tool:search*", "tool:shell", "tool:", "tool:search:x"):
        with pytest.raises(ScopeNotGranted):
            offline.authorize(grant.token, wider)


def test_oversized_and_deeply_nested_tokens_are_refused_as_invalid(tree, offline):
    with pytest.raises(TokenInvalid, match="exceeds"):
        offline.verify("a" * 9000 + ".b.c")
    # Within the size limit, but a header nested deeper than the parser's
    # recursion: refused as a bad token, not an exception of another kind
    # (a tool server answering 500, or a gate dying on unsigned input).
    deep = b64(b"[" * 2500 + b"]" * 2500)
    for token in (f"{deep}.e30.AA", f"{b64(json.dumps({'alg': 'EdDSA', 'kid': 'k'}).encode())}.{deep}.AA"):
        assert len(token) < 8 << 10
        with pytest.raises(TokenInvalid):
            offline.verify(token)


def test_a_revoked_or_terminated_holders_token_is_refused_once_the_feed_delivers(tree, offline):
    _, grant = child_grant(tree, "revoked")
    offline.verify(grant.token)
    seq = _wire.uint64(tree.operator.call("CapabilityService", "Revoke", {"grantId": grant.grant_id, "reason": "rogue"})["sequence"])
    assert offline.wait_for_sequence(seq, timeout=BUDGET)
    with pytest.raises(GrantRevoked):
        offline.verify(grant.token)

    child, grant = child_grant(tree, "terminated")
    offline.verify(grant.token)
    terminate(tree.operator, child.node_id, "abort", ack="1s", confirm="1s")

    def refused() -> bool:
        try:
            offline.verify(grant.token)
            return False
        except GrantRevoked:
            return True

    wait_for("the terminated holder's grant on the revocation feed", refused, timeout=BUDGET)


# -- the lease worker and the fence ---------------------------------------------


def test_forged_fencing_headers_neither_pass_nor_fence_the_real_holder_out(server, tree, tmp_path):
    from tether_agentsdk import Conn, Fence, Fenced, LeaseWorker, UnissuedGeneration, issued_generations

    child = tree.root.spawn("holder")
    rogue = tree.root.spawn("fence-rogue")
    job_id = "rogue13-fence-" + child.node_id
    offered = tree.operator.call("LeaseService", "Offer", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s"})["lease"]
    w = LeaseWorker(Conn(server.url, child.credential), str(tmp_path), renew_every=60)
    job = w.accept(offered)
    fence = Fence(check=issued_generations(server.tool_server("rogue13-fenced-tool-" + uuid.uuid4().hex[:6])))
    try:
        # The rogue claims a generation nobody holds, and a job nobody leased.
        with pytest.raises(UnissuedGeneration):
            fence.admit_headers({"tether-job-id": job_id, "tether-lease-generation": "99"})
        with pytest.raises(UnissuedGeneration):
            fence.admit_headers({"Tether-Job-Id": "no-such-job", "Tether-Lease-Generation": "1"})
        for bad in ("0", "-1", "01", "1e3", " 1", "1 ", "18446744073709551616", "", "١"):
            with pytest.raises(ValueError):
                fence.admit_headers({"Tether-Job-Id": job_id, "Tether-Lease-Generation": bad})
        assert fence.highest(job_id) <= 1, "a refused claim raised the fence above the generation issued"
        # The real holder still writes.
        fence.admit_headers(job.headers())

        # A peer that does not coordinate the job cannot cancel it.
        with pytest.raises(ConnectError):
            Conn(server.url, rogue.credential).call("LeaseService", "RequestCancel", {"jobId": job_id, "reason": "rogue"})
        assert not tree.operator.call("LeaseService", "GetLease", {"jobId": job_id})["lease"].get("cancelRequested")
        assert not job.cancelled.is_set()

        # Reassigned: generation 2 writes, the old holder is fenced.
        gen2 = tree.operator.call("LeaseService", "Reassign", {"jobId": job_id, "holderIdentity": child.node_id, "leaseDuration": "30s", "reason": "test"})["lease"]
        job2 = w.accept(gen2)
        fence.admit_headers(job2.headers())
        assert fence.highest(job_id) == _wire.uint64(gen2["leaseGeneration"])
        with pytest.raises(Fenced):
            fence.admit_headers(job.headers())
        job2.stop()
    finally:
        job.stop()
        w.close()


def test_a_missing_or_non_string_token_is_refused_as_invalid(offline):
    # A tool server that hands over a header it did not get (None), or a
    # list of repeated headers, gets a refusal, not a TypeError (a 500).
    for token in (None, b"a.b.c", ["a.b.c"], 7):
        with pytest.raises(TokenInvalid):
            offline.verify(token)  # type: ignore[arg-type]


def test_a_token_for_another_audience_or_issuer_is_refused_even_under_a_trusted_key(tree, offline):
    # The rogue cannot sign under the control plane's key: the check is
    # shown with a key the lookup trusts, holding a real token's claims.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from tether_agentsdk.verifier import parse_capability_token

    _, grant = child_grant(tree, "audience")
    claims = json.loads(base64.urlsafe_b64decode(grant.token.split(".")[1] + "=="))
    key = Ed25519PrivateKey.generate()

    def mint(**over):
        h = b64(json.dumps({"alg": "EdDSA", "kid": "trusted"}).encode())
        p = b64(json.dumps({**claims, **over}).encode())
        return f"{h}.{p}.{b64(key.sign(f'{h}.{p}'.encode()))}"

    keys = {"trusted": key.public_key()}
    now = offline.clock()
    parse_capability_token(mint(), keys, issuer="tether", now=now, leeway=5)
    for aud in ("other-tool-server", ["tether-api"], [], "tether"):
        with pytest.raises(TokenInvalid, match="audience"):
            parse_capability_token(mint(aud=aud), keys, issuer="tether", now=now, leeway=5)
    with pytest.raises(TokenInvalid, match="issuer"):
        parse_capability_token(mint(iss="rogue"), keys, issuer="tether", now=now, leeway=5)
