"""examples/python/agent.py, stopped mid-run by `tether terminate`, and the
record showing its tool call."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

from conftest import REPO


def test_the_example_agent_is_stopped_mid_call_by_tether_terminate(server, tree, tmp_path):
    child = tree.root.spawn("py-example")
    grant = tree.root.delegate(tree.root_grant_id, child.node_id, ["tool:fetch"], ttl=600)
    (tmp_path / "agent.cred").write_text(child.credential)
    (tmp_path / "tool.token").write_text(server.tool_server("py-example-gate").token)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "examples" / "python" / "agent.py"), "--addr", server.url,
         "--credential-file", str(tmp_path / "agent.cred"), "--grant", grant.grant_id,
         "--tool-token-file", str(tmp_path / "tool.token"), "--step", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip()) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []

    def wait_line(text: str) -> None:
        while text not in seen:
            seen.append(lines.get(timeout=30))

    try:
        # The first call is in flight until the stop cancels it (a step of
        # ten minutes: a loaded machine's slow CLI must not let it end
        # first, as the three seconds it was given once did).
        wait_line("calling 1")
        out = server.cli("terminate", child.node_id, "--mode", "abort", "--reason", "test", "--cancel-ack-timeout", "30s",
                         "--confirm-timeout", "2s", "--wait")
        # "... record r_… (tether record show r_…)" once terminated
        record_id = out.strip().splitlines()[-1].split()[1]
        wait_line("exited")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped during call 1: ToolCallCancelled" in seen or "stopped during call 1: CancelledError" in seen, seen
    record = json.loads(server.cli("record", "show", record_id, "-o", "json"))
    record = record.get("record", record)
    calls = [(c["tool"], c["nodeId"], c["resolution"]) for c in record.get("toolCalls", [])]
    assert calls == [("fetch", child.node_id, "CALL_RESOLUTION_CANCELLED_ACKED")]
