"""The twenty-second hostile pass on the Python SDK: a peer's error that
echoes the bearer token (a proxy quoting the request it refused, or a
hostile control plane) carried the token, and its signature, into the
ConnectError a call raised (its message, its details, the exception it was
chained from) and into the verifier's log lines."""

from __future__ import annotations

import base64
import json
import logging
import struct
import threading

import pytest

from conftest import REPO, require_extra
from helpers import LoopbackPeer, QuietHandler, terminate, wait_for
from tether_agentsdk import Conn, ConnectError, Verifier

TOKEN = ("eyJhbGciOiJFZERTQSIsImtpZCI6InJvZ3VlIn0.eyJzdWIiOiJyb2d1ZTIyIn0."
         "c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw")
SIGNATURE = "c2lnbmF0dXJlLW9mLXRoZS1yb2d1ZTIyLXRva2VuLXRoYXQtaXMtbG9uZw"


def _echoed_error(presented: str) -> dict:
    sig = presented.rsplit(".", 1)[-1]
    # google.protobuf.StringValue{value: "you sent <sig>"}: field 1, bytes.
    value = ("you sent " + sig).encode()
    detail = bytes([0x0A, len(value)]) + value
    return {
        "code": "permission_denied",
        "message": f"refused Authorization: Bearer {presented} (signature {sig})",
        "details": [{"type": "google.protobuf.StringValue", "value": base64.b64encode(detail).decode().rstrip("="),
                     "debug": {"value": "you sent " + sig}}],
    }


class EchoPeer(LoopbackPeer):
    """Answers every call with an error quoting the token it was sent: a
    unary call's as a 403, a stream's in its end-of-stream message;
    ``/GarbledStatus`` answers a status line that quotes it; the key set
    names a key by it."""

    def __init__(self):
        super().__init__()

        class Handler(QuietHandler):
            def do_GET(self):
                self.answer_json({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": TOKEN, "x": "AAAA"}]})

            def do_POST(self):
                self.read_body()
                presented = self.headers.get("Authorization", "").removeprefix("Bearer ")
                method = self.path.rsplit("/", 1)[-1]
                if method == "GetNode":
                    self.wfile.write(f"HTTP/1.1 2OO {presented}\r\n\r\n".encode())
                    return
                if method in ("WatchCancels", "WatchRevocations"):
                    end = json.dumps({"error": _echoed_error(presented)}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/connect+json")
                    self.send_header("Content-Length", str(5 + len(end)))
                    self.end_headers()
                    self.wfile.write(struct.pack(">BI", 2, len(end)) + end)
                    return
                data = json.dumps(_echoed_error(presented)).encode()
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.serve(Handler)


@pytest.fixture
def echo_peer():
    p = EchoPeer()
    yield p
    p.close()


def _holds_secret(err: BaseException) -> str:
    """Where err (its text, its details, or an exception it is chained to)
    still carries the token or its signature."""
    def has(text: str) -> bool:
        return TOKEN in text or SIGNATURE in text

    seen = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if has(str(e)) or has(repr(e.args)):
            return f"{e.__class__.__name__}: {e}"
        if isinstance(e, ConnectError):
            if has(e.message) or has(json.dumps(e.details)):
                return f"message or details: {e.message} {e.details}"
            for d in e.details:
                if isinstance(d, dict) and isinstance(d.get("value"), str):
                    raw = base64.b64decode(d["value"] + "=" * (-len(d["value"]) % 4))
                    if has(raw.decode("latin-1")):
                        return "a detail's value"
        e = e.__cause__ or e.__context__
    return ""


def test_a_calls_error_carries_neither_the_bearer_token_nor_its_signature(echo_peer):
    conn = Conn(echo_peer.url, TOKEN, timeout=5)
    with pytest.raises(ConnectError) as unary:
        conn.call("AuthService", "WhoAmI")
    assert unary.value.code == "permission_denied"
    assert _holds_secret(unary.value) == "", "a unary call's error"
    assert "[bearer token]" in unary.value.message

    with pytest.raises(ConnectError) as garbled:
        conn.call("AgentService", "GetNode", {"nodeId": "n"})
    assert garbled.value.code == "unavailable"
    assert _holds_secret(garbled.value) == "", "an answer whose status line quotes the token"

    stream = conn.stream("ToolService", "WatchCancels", {"gateId": "py-rogue22"})
    with pytest.raises(ConnectError) as streamed:
        for _ in stream:
            pass
    stream.close()
    assert streamed.value.code == "permission_denied"
    assert _holds_secret(streamed.value) == "", "a stream's error"


def test_the_verifiers_log_carries_neither(echo_peer, caplog):
    require_extra("cryptography")
    caplog.set_level(logging.WARNING, logger="tether_agentsdk")
    v = Verifier(Conn(echo_peer.url, TOKEN, timeout=5), offline=True).start()
    try:
        wait_for("the verifier to warn of its key set and its feed", lambda: (
            any("key set" in r.getMessage() for r in caplog.records)
            and any("revocation feed" in r.getMessage() for r in caplog.records)))
    finally:
        v.close()
    for r in caplog.records:
        assert TOKEN not in r.getMessage() and SIGNATURE not in r.getMessage(), r.getMessage()


def _doc_block(heading: str, fence: str) -> str:
    """The first code block (```fence) under a heading of docs/integrating.md."""
    text = (REPO / "docs" / "integrating.md").read_text()
    section = text[text.index(heading):]
    start = section.index("```" + fence + "\n") + len(fence) + 4
    return section[start:section.index("```", start)]


def test_the_integrating_docs_python_agent_runs_as_written(server):
    """docs/integrating.md's Python agent called a function it never
    defined. Run as written (only its address is the test server's, and
    admin_token and tool_server_token are given), it is drained mid-loop by
    a termination of its planner, and the record shows the retriever's exit
    confirmed."""
    code = _doc_block("## In Python", "python").replace("http://127.0.0.1:7420", server.url)
    operator = server.operator()
    tool_token = operator.call("AuthService", "CreateToken", {"toolServer": "search-gate"})["token"]
    ns: dict = {"admin_token": server.admin, "tool_server_token": tool_token}
    terminated: dict = {}

    def drain_when_running() -> None:
        try:
            wait_for("the doc's agent to open its gate", lambda: "gate" in ns and ns["me"].opened.is_set())
            terminated.update(terminate(operator, ns["planner"].node_id, "drain", confirm="20s"))
        except BaseException as e:  # reported by the test's thread
            terminated["error"] = e

    helper = threading.Thread(target=drain_when_running, daemon=True)
    helper.start()
    exec(compile(code, "docs/integrating.md (Python agent)", "exec"), ns)
    helper.join(30)
    assert "error" not in terminated, terminated.get("error")
    # The launcher's word for the planner, whose process the snippet is.
    operator.call("AgentService", "ConfirmExit", {"nodeId": ns["planner"].node_id, "reason": "test"})
    tid = terminated["terminationId"]
    with operator.stream("SupervisorService", "WatchTermination", {"terminationId": tid}, read_timeout=60) as watch:
        for msg in watch:
            if msg.get("termination", {}).get("state") == "TERMINATION_STATE_TERMINATED":
                break
    record = operator.call("SupervisorService", "GetRecord", {"terminationId": tid})["record"]
    outcomes = {n["name"]: n.get("outcome") for n in record["nodes"]}
    assert outcomes["retriever"] == "NODE_OUTCOME_CONFIRMED", outcomes
