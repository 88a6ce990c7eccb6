"""Tether's agent SDK for Python.

The core uses only the standard library (Connect with JSON over HTTP/1.1),
so it drops into any agent's environment. Optional extras: ``crypto``
(offline token verification with ``cryptography``), ``openai-agents`` and
``langgraph`` (adapters in ``tether_agentsdk.adapters``).

For agent frameworks: Agent (register or join, spawn and delegate, drain and
abort signals, credential refresh, confirm exit) and LeaseWorker. For tool
servers: ToolGate and tool_gate (every call in the ledger, refused while
the caller drains, cancelled on abort) and Verifier.
"""

from ._connect import DEFAULT_RETRY, ConnectError, Conn, Retry, ServerStream
from .agent import Aborted, Agent, Child, Grant, Signal, TokenSource, list_subtree
from .fence import (
    HEADER_JOB_ID, HEADER_LEASE_GENERATION, Authority, Fence, Fenced, NoAuthority, UnissuedGeneration, issued_generations,
)
from .leaseworker import CANCELLED, FAILED, SUCCESS, AckRefused, Job, LeaseWorker, Spooled, WorkerClosed
from .toolgate import CAPABILITY_HEADER, GateCall, ToolCallCancelled, ToolGate, ToolRefused, current_call, tool_gate
from .verifier import (
    HAVE_CRYPTOGRAPHY, Claims, FeedStale, GrantRevoked, ScopeNotGranted, TokenExpired, TokenInvalid, TreeNotFollowed, Verifier,
    VerifyError, allows,
)

__version__ = "0.1.0"

__all__ = [
    "Aborted", "AckRefused", "Agent", "DEFAULT_RETRY", "Retry", "CANCELLED", "CAPABILITY_HEADER", "Child", "Claims", "ConnectError", "Conn",
    "FAILED", "FeedStale", "Fence", "Fenced", "HEADER_JOB_ID", "HEADER_LEASE_GENERATION", "UnissuedGeneration",
    "issued_generations", "Authority", "NoAuthority", "GateCall", "Grant", "GrantRevoked", "HAVE_CRYPTOGRAPHY", "Job", "LeaseWorker",
    "SUCCESS", "ScopeNotGranted", "ServerStream", "Signal", "Spooled", "TokenExpired", "TokenInvalid", "TreeNotFollowed",
    "TokenSource", "ToolCallCancelled", "ToolGate", "ToolRefused", "Verifier", "VerifyError", "allows",
    "current_call", "list_subtree", "tool_gate", "WorkerClosed",
]
