"""A real Tether server for the tests: the binary built from this
repository (or $TETHER_BIN), on a loopback port, over a temporary data
directory."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

# The tests run against the source tree, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tether_agentsdk import Agent, Conn, Retry, ToolGate, tool_gate  # noqa: E402

# The test server's connections retry nothing: a test sees every answer the
# server gives, a rate limit's refusal included (the Go and TypeScript test
# servers' clients too). Agents registered with them inherit it.
NO_RETRY = Retry(attempts=1)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tether_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    if os.environ.get("TETHER_BIN"):
        return os.environ["TETHER_BIN"]
    if not shutil.which("go"):
        pytest.fail("no tether binary: set TETHER_BIN or install Go to build one")
    out = tmp_path_factory.mktemp("bin") / "tether"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/tether"], cwd=REPO, check=True)
    return str(out)


# The lowest port _free_port picks.
PORT_FLOOR = 10000


def _free_port() -> int:
    """A loopback port for a ``tether serve`` to bind, free a moment ago. A
    port from a bind to port 0 lies in the kernel's ephemeral range; once
    released it is the kernel's to hand to any listen on port 0 or outgoing
    connection (this process's clients and peers, any other process's)
    before the server binds it, which then exits "address already in use".
    Ports are picked at random below that range where there is room, as the
    Go tests' are (internal/freeport)."""
    low = _ephemeral_low()
    if low > PORT_FLOOR:
        for _ in range(64):
            port = random.randrange(PORT_FLOOR, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux), or 0 when it cannot be read."""
    try:
        fields = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(fields[0]) if len(fields) == 2 else 0
    except (OSError, ValueError):
        return 0


@dataclass
class Server:
    url: str
    admin: str
    data_dir: Path
    bin: str
    proc: subprocess.Popen

    def operator(self) -> Conn:
        return Conn(self.url, self.admin, retry=NO_RETRY)

    def tool_server(self, name: str) -> Conn:
        """A connection with a tool server's own token, named name (the gate id):
        the tool ledger accepts only tool servers."""
        minted = self.operator().call("AuthService", "CreateToken", {"toolServer": name})
        return Conn(self.url, minted["token"], retry=NO_RETRY)

    def cli(self, *args: str) -> str:
        """Runs the tether CLI against this server as the admin."""
        out = subprocess.run([self.bin, "--addr", self.url, "--token", self.admin, *args],
                             check=True, capture_output=True, text=True, timeout=60)
        return out.stdout

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_server(bin_path: str, data_dir: Path, *extra: str, addr: str | None = None) -> Server:
    addr = addr or f"127.0.0.1:{_free_port()}"
    log = open(data_dir / "serve.log", "ab")
    proc = subprocess.Popen([bin_path, "serve", "--data-dir", str(data_dir), "--listen", addr, "--log-level", "warn", *extra],
                            stdout=subprocess.DEVNULL, stderr=log)
    url = "http://" + addr
    deadline = time.monotonic() + 30
    while True:  # polling a condition another process makes true
        if proc.poll() is not None:
            raise RuntimeError("tether serve exited early:\n" + (data_dir / "serve.log").read_text()[-4000:])
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("tether serve did not become healthy in 30s")
        time.sleep(0.02)
    admin = (data_dir / "admin.token").read_text().strip()
    return Server(url=url, admin=admin, data_dir=data_dir, bin=bin_path, proc=proc)


@pytest.fixture(scope="session")
def server(tether_bin: str, tmp_path_factory: pytest.TempPathFactory):
    s = start_server(tether_bin, tmp_path_factory.mktemp("tether-data"))
    yield s
    s.stop()


@pytest.fixture
def operator(server: Server) -> Conn:
    return server.operator()


@pytest.fixture
def gate(server: Server):
    """A started tool gate of a tool server of its own, its cancel
    orders open, closed after the test."""
    name = "pytest-gate-" + uuid.uuid4().hex[:8]
    g = ToolGate(server.tool_server(name), name).start()
    assert g.ready.wait(10), "the gate's cancel orders did not open"
    yield g
    g.close()


@dataclass
class Tree:
    """A root agent holding a root grant (tool:*), its running session,
    and the operator that made them."""

    operator: Conn
    root: Agent
    root_grant_id: str
    root_token: str


@pytest.fixture
def tree(server: Server, request: pytest.FixtureRequest):
    op = server.operator()
    root = Agent.register_root(op, request.node.name[:60].replace("[", "-").replace("]", ""))
    root.heartbeat_every = 0.5
    g = op.call("CapabilityService", "IssueRoot", {"holderNodeId": root.node_id, "scopes": ["tool:*"], "ttl": "3600s"})
    root.start()
    assert root.opened.wait(10), "the root's signal stream did not open"
    yield Tree(operator=op, root=root, root_grant_id=g["grant"]["grantId"], root_token=g["token"])
    root.close()


@contextlib.contextmanager
def drain_holding_a_call(operator, gate, token, node_id):
    """The operator drains node_id once a call made with token (the node's
    own grant) is in flight at gate; the call is held open, and so the
    drain, until the block ends."""
    from helpers import terminate  # helpers imports this module

    inside, release = threading.Event(), threading.Event()

    def holder():
        with tool_gate(gate, "hold", token=token):
            inside.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert inside.wait(10)
        terminate(operator, node_id, "drain", confirm="1s")
        yield
    finally:
        release.set()
        t.join(30)


@pytest.fixture
def draining(tree, gate):
    """The tree's root draining, a call of its own held in flight so that
    the drain stays open."""
    with drain_holding_a_call(tree.operator, gate, tree.root_token, tree.root.node_id):
        assert tree.root.draining.wait(10)
        yield tree


def require_extra(module: str):
    """Imports an optional extra, or skips — unless TETHER_REQUIRE_EXTRAS is
    set (the extras run), where a missing extra fails."""
    if os.environ.get("TETHER_REQUIRE_EXTRAS"):
        return __import__(module)
    return pytest.importorskip(module)
