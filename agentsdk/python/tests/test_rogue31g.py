"""The thirty-first hostile pass on the Python SDK's offline verifier: the
crafted tokens of agentsdk/testdata/rogue31g_tokens.json (signed by the key
of its key set) get the control plane's verdict, which the Go verifier
gives them (agentsdk/rogue31gcorpus_test.go writes the file and holds the
Go verifier to it; the TypeScript verifier is held to it too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import require_extra

CORPUS = json.loads((Path(__file__).resolve().parents[2] / "testdata" / "rogue31g_tokens.json").read_text())


@pytest.mark.parametrize("case", CORPUS["cases"], ids=[c["name"] for c in CORPUS["cases"]])
def test_rogue31g_the_verifier_gives_the_control_planes_verdict(case):
    require_extra("cryptography")
    from tether_agentsdk.verifier import VerifyError, parse_capability_token, parse_jwks

    keys = parse_jwks(json.dumps(CORPUS["jwks"]).encode())
    now, leeway = CORPUS["now_ms"] / 1000, CORPUS["leeway_ms"] / 1000
    if not case["accept"]:
        # A refusal is a VerifyError, never an exception of another kind
        # out of the gate or tool server.
        with pytest.raises(VerifyError):
            parse_capability_token(case["token"], keys, issuer=CORPUS["issuer"], now=now, leeway=leeway)
        return
    claims = parse_capability_token(case["token"], keys, issuer=CORPUS["issuer"], now=now, leeway=leeway)
    assert claims.grant_id == case["grant_id"]
    assert list(claims.chain) == case.get("chain", [])
    assert list(claims.scopes) == case["scopes"]
    assert claims.expires_at * 1000 == case["expires_at_ms"]
