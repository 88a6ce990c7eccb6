// @tetherhq/agentsdk: how agent frameworks and tool servers written in
// TypeScript plug into Tether. It speaks only the public API (Connect over
// HTTP/2) and carries the Go SDK's concepts: Agent, ToolGate, Verifier,
// LeaseWorker.
export { Conn, DefaultRetry, DefaultTimeoutMs, MaxMessageBytes, MaxReconnectHintMs, retryHintMs, type DialOptions, type RetryOptions } from "./conn.js";
export { Agent, CapabilityToken, MaxUnansweredHeartbeats, type CapabilityTokenOptions, type Child, type Grant, type RunOptions, type Signal } from "./agent.js";
export { ToolGate, CancelWatchRefreshMs, CapabilityHeader, MaxEarlyOrders, gateCallId, tokenOf, type CallOptions, type TokenSource, type ToolGateOptions } from "./toolgate.js";
export { Verifier, JwksPath, DefaultCacheSize, MaxCachedClaimBytes, MaxCachedTokensPerHolder, type Clock, type VerifierOptions } from "./verifier.js";
export { allows, validScope, verifyToken, parseJwks, compactJWS, Audience, MaxTokenBytes, TokenError, type Claims, type TokenErrorKind } from "./capability.js";
export { Fence, Fenced, NoAuthority, UnissuedGeneration, issuedGenerations, HeaderJobId, HeaderLeaseGeneration, MaxJobIdBytes, type Authority, type FenceOptions, type GenerationCheck } from "./fence.js";
export { LeaseWorker, Job, JobEnded, WorkerClosed, retryable, TerminalResult, type JobEndKind, type JobOptions, type LeaseWorkerOptions } from "./leaseworker.js";
export { TetherScope, type ChildOptions } from "./scope.js";
export { listSubtree, MaxPages, type ListSubtreeRequest } from "./subtree.js";
export { StopSignalled, ToolCallCancelled, isRefusedStopping, isRefusedToken } from "./errors.js";
export { NodeState, SignalKind, type Node } from "./gen/tether/v1/agent_pb.js";
export { CallResolution, CallState, type ToolCall } from "./gen/tether/v1/tool_pb.js";
export { LeaseState, Outcome, type Lease, type Decision } from "./gen/tether/v1/lease_pb.js";
