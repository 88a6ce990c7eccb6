"""A Python agent on tether_agentsdk: it joins the control plane with the
credential its parent (or an operator) obtained for it, follows its signals,
and calls a gated tool with its capability token, one step at a time, until
it is told to stop: on drain it finishes the step in hand; on abort the step
is cancelled mid-call (the gate acknowledges it once the tool stopped).
Then it confirms its exit.

    tether token create --tool-server py-example-gate > tool.token
    tether agent register --name py-agent --print credential > agent.cred
    NODE=$(tether whoami --token-file agent.cred --print node_id)
    GRANT=$(tether grant root --holder "$NODE" --scope tool:fetch --ttl 1h --print grant_id)
    python examples/python/agent.py --credential-file agent.cred --grant "$GRANT" \\
        --tool-token-file tool.token
    tether terminate "$NODE" --mode abort --wait && tether record show <termination>

The gate runs in this process for the example's sake; in production it lives
in the tool server, with that server's own token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "agentsdk" / "python" / "src"))

from tether_agentsdk import Aborted, Agent, Conn, ToolCallCancelled, ToolGate, ToolRefused, tool_gate  # noqa: E402


_said = threading.Lock()


def say(line: str) -> None:
    """Prints a whole line: the drain callback says its own on a thread of
    its own, and print writes a line and its end apart."""
    with _said:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def read(path: str) -> str:
    return Path(path).read_text().strip()


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="http://127.0.0.1:7420")
    p.add_argument("--credential-file", required=True, help="the agent's credential")
    p.add_argument("--grant", required=True, help="id of the agent's grant (scope tool:fetch); its token is refreshed while the grant lives")
    p.add_argument("--tool-token-file", required=True, help="the gate's own token (tether token create --tool-server py-example-gate)")
    p.add_argument("--step", type=float, default=1.0, help="seconds one tool call takes")
    args = p.parse_args()

    agent = Agent.join(args.addr, read(args.credential_file))
    agent.on_drain(lambda s: say(f"told to stop (abort={s.abort}): {s.reason}"))
    gate = ToolGate(Conn(args.addr, read(args.tool_token_file)), "py-example-gate")
    # A token lives minutes, the grant as long as its TTL: the source
    # refreshes the token before it expires.
    capability = agent.token_source(agent.refresh_token(args.grant))

    @tool_gate(gate, "fetch", token=capability)
    async def fetch(n: int) -> str:
        say(f"calling {n}")
        await asyncio.sleep(args.step)  # an abort cancels it here
        return f"page {n}"

    with agent, gate:
        say(f"joined as {agent.node_id}")
        work = asyncio.current_task()
        assert work is not None
        agent.cancel_on_abort(work)
        n = 0
        try:
            while not agent.draining.is_set():
                n += 1
                await fetch(n)
                say(f"call {n} done")
        except (asyncio.CancelledError, ToolCallCancelled, ToolRefused, Aborted) as e:
            say(f"stopped during call {n}: {e.__class__.__name__}")
        try:
            await asyncio.to_thread(agent.confirm_exit, "stopped by the control plane")
        except Exception as e:  # the node may be terminated already: its credential is dead
            say(f"confirm exit: {e}")
    say("exited")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
