// Package mcpgate puts Model Context Protocol tool calls on the tether: a
// gateway in front of real MCP servers (upstreams over stdio or Streamable
// HTTP) that agents reach with their capability token, either over
// Streamable HTTP (the token is the bearer) or through a stdio wrapper that
// a framework launches instead of the server itself.
//
// The gateway is a tool layer in Tether's sense. It holds its own
// credential (a tool server's, never the agent's) and is the party that
// begins, ends and cancel-acknowledges every MCP call in the control
// plane's tool-call ledger, through agentsdk.ToolGate; the record's
// evidence about MCP calls therefore never comes from the agent.
//
// # Scopes
//
// An upstream tool is the scope "mcp:<upstream>/<tool>" and follows the
// one wildcard rule of package capability: "mcp:*" allows every MCP tool,
// "mcp:fs/*" every tool of the upstream named fs, "mcp:fs/read_*" the fs
// tools whose names start with read_. (A pattern without the slash,
// "mcp:fs*", also matches an upstream named fs2.) tools/list shows only the
// tools the token allows; tools/call checks the scope with the offline
// agentsdk.Verifier (signature, expiry, the revocation feed, failing closed
// when the feed is stale) before anything reaches the upstream, then has
// the control plane begin the call (which checks again and refuses while
// the node drains or aborts). Over HTTP every request is checked for
// revocation the same way before it reaches a session: a token whose grant
// (or an ancestor's) the verifier knows revoked — a terminated node's
// grants are — is refused at the door, 403 with CodeDenied, so that a
// revoked agent cannot keep its sessions alive with ping, nor open new
// ones, until its token expires. Such a refusal (at the door, or a
// tools/list or tools/call refused past it, or any request over stdio) is
// reported to the control plane, a BeginCall on the refused token that it
// refuses and keeps as the node's activity (after its session's end, life
// after it), at most once per node per RefusalReportInterval (the
// refusals after a report, within its interval, by one report at the
// interval's end): refused silently, a rogue's calls after its claim of
// exit left the record confirming it. The refusal that starts a report is answered once the
// report has landed (RefusalReportWait at the most), so that a claim of
// exit sent on reading it cannot outrun it. A request the gateway serves a
// live grant without a tool call, or refuses over HTTP for the node's
// connections or body bytes (ping, initialize, tools/list,
// notifications, a GET stream or DELETE, a batch, a tools/call
// answered without being begun: refused offline, a tool it does not
// have, parameters refused; over stdio any request the MCP SDK answers
// before the gateway's handler) is reported likewise before it is served, a BeginCall of
// SeenReportTool that the control plane begins nothing for and keeps as
// the node's credential at work (the gateway learns revocations, not
// claims: a rogue that claimed its exit and pinged on was unseen); a
// node's reports are bounded to SeenReportBurst at once and one per
// SeenReportInterval after, the requests past the bound sharing the next.
// A report that did not land (not sent past the reports in flight, or
// failed: the control plane unreachable, a budget spent) is owed, and
// sent again after SeenReportRetry, doubling to SeenReportRetryMax, until
// one lands; so is a refusal's report not sent or not landed, as the node
// seen, and so is a tools/call whose BeginCall did not land (the control
// plane out of reach, its answer late: answered CodeUnavailable, never
// begun). A gateway that closes sends each report still owed, or due (a
// refusal's waiting for its interval's end included), once more before
// Close returns, 64 at once; only those that do not
// land then are logged (and, once one fails for another reason than a
// spent budget, the rest, not sent), and lost, unless
// Config.OwedReportsFile keeps them on disk: rewritten as the debts
// change (a request whose report did not land is answered once its debt
// is written), left holding those that did not land at Close, and read
// at Start, which sends each, so that neither a gateway killed nor one
// closed with the control plane out of reach loses a report. A node owed is never forgotten: the gateway keeps the report state
// of at most 4096 nodes, a lineage's (the nodes whose grants descend from
// one root grant) at most a quarter of them (a node held while a report
// of it is due, under way or owed, or an HTTP request of its is in the
// gateway, a GET stream only until its opening is reported, a tools/call
// until it is begun), and over
// HTTP a request of a node it has no room for is refused (503,
// CodeUnavailable), not served unreported. A token past its expiry still names its holder (agentsdk.Verifier.Holder):
// over stdio its requests are served as before and reported, over HTTP
// its 401 is reported, as that node seen, which the control plane keeps
// as the holder's dead credential at work; so is, over HTTP, the 503 of
// any request whose bearer names its holder while the revocation feed is
// stale.
//
// Upstream tools whose names are not 1 or more of A-Z a-z 0-9 . _ - /
// (the MCP specification's recommended characters, plus the slash), or
// whose scope would exceed capability.MaxScopeBytes, cannot be granted: the
// gateway hides them and logs why. Upstreams whose tool prefixes could
// collide (one begins another) are refused, so that no upstream can take
// another's tool name; a listing stops at MaxToolsPerUpstream tools,
// MaxToolPages pages or MaxToolListBytes of tools and cursors, and the MCP
// SDK's client is made to forget the pages of a listing that stops (the
// gateway keeps the tools of its last listing). A stdio upstream gets the gateway's environment
// without its TETHER_ variables (the gateway's and the agent's
// credentials), plus its Env.
//
// # Drain, abort, cancellation
//
// While the token holder's subtree drains or aborts, new tools/call are
// refused with CodeStopping and the control plane's reason; calls in flight
// go on. When the control plane cancels a call (abort, or a drain window
// that ran out), the gateway abandons the upstream request — the Go SDK
// sends notifications/cancelled, on stdio and on Streamable HTTP — and only
// after the upstream call has been abandoned acknowledges the cancel in the
// ledger; the agent gets CodeCancelled. An upstream whose answer arrived
// before the cancel took effect ran the call: the ledger records it
// completed (or failed), never cancelled, and the agent gets the answer.
// MCP cancellation is advisory: an upstream that ignores
// notifications/cancelled may go on working; the ledger's acknowledgement
// says the gateway stopped waiting for it and told it to stop. The
// upstream's answer to the call is still listened for, CancelAnswerGrace
// (2 s) after the cancel (a stdio upstream's on its connection, a
// Streamable HTTP upstream's on the call's POST, kept open for it, and on
// the call's event stream resumed, by the gateway after the cancel, when
// the upstream ends it without the answer, as MCP lets it, and on the
// upstream's standalone stream, which MCP forbids it to answer on): one
// with a result (neither a JSON-RPC error nor isError) says the call ran
// on past its cancel, and it is recorded as it answered, never cancelled;
// an error, silence or the connection's (the POST's) end has the cancel
// acknowledged (a POST's event stream ended without an event id, only
// when the upstream has no standalone stream open: otherwise the grace's
// end). A call
// whose request is still being written to a stdio upstream (one that no
// longer reads its input) when the cancel comes ends that connection: the
// rest is never written, the upstream is started again, and the cancel is
// acknowledged. An agent's
// own cancellation (its notifications/cancelled, or its stdio session's
// end) does not reach a call the gateway has begun: the call goes on at
// the upstream until it answers, and the ledger records that answer, or
// until the control plane cancels it — the agent being stopped cannot have
// its call in flight recorded failed, nor taken out of a drain's wait, on
// its own word. A gateway that shuts down (Close, or the end of
// ServeStdio's context) stops waiting for its calls in flight and records
// them failed in its own words (it shut down; whether the upstream ran the
// call is unknown). A gateway that dies mid-call acknowledges
// nothing, and the record shows the call unresolved; on Linux its stdio
// upstreams' processes die with it (the parent-death signal). Close waits for no
// upstream's word: a relisting ends as it begins, and so does each write
// of the gateway's answer to the upstream's own request (ping,
// roots/list), ConnectTimeout after it began at the latest; over stdio
// such a write still under way then ends the connection, as a call's
// does. At most MaxAnswersInFlight such answers are under way on one
// connection to an upstream at once: a request of the upstream's past
// them is left unanswered (logged). An upstream that answers a call with
// MCP's input_required (asking for input in the answer itself, to have the
// call sent again with the answers) has the call fail, CodeUnavailable,
// recorded failed: the gateway gives an upstream no input, and sends each
// call once. Close closes the upstreams' connections together (64 at once):
// a stdio upstream's input ends at once, and its process is given the MCP
// SDK's 5 s to exit, 5 s more after SIGTERM, then SIGKILL, every
// upstream's at the same time; the reports owed are sent meanwhile, and
// the calls abandoned recorded once their upstreams are gone (a stdio
// upstream's process may go on with a call until then). On Unix a stdio
// upstream runs as the leader of a process group of its own, and what is
// left of the group once the upstream's process has gone (on any end of
// its connection) is killed, before those calls are recorded: a process
// the upstream started for a call does not outlive it (one that left the
// group, by setsid, does).
//
// # Sessions
//
// Over HTTP every session is held in the gateway's memory: a node keeps at
// most HTTPOptions.MaxSessionsPerNode open at once (its next initialize is
// refused with CodeTooManySessions), and a session idle for
// HTTPOptions.SessionIdleTimeout is closed. A session whose latest
// request's grant the verifier learns revoked (a terminated node's grants
// are) is ended as the revocation arrives (within RevocationScanInterval:
// the gateway reads its sessions for revoked grants at most that often),
// with its streams: a tools/call
// in flight on it is answered CodeDenied, and goes on at the upstream until
// it answers or the control plane cancels it, recorded as it ends and
// counted against its node until then. The stdio session (ServeStdio)
// is ended likewise, as the revocation arrives or as any request of the
// agent finds its token's grant revoked (that request refused, and
// reported): its call in flight answered CodeDenied, the session closed
// once the answers in flight are written, and ServeStdio returning the
// revocation. A call whose upstream answers as its session is ended is
// answered CodeDenied, not handed the result. HTTPServer's connections are
// bounded per node too (HTTPOptions.MaxConnsPerNode: its request on one
// more is refused with CodeTooManyConnections, HTTP 429, and that
// connection closed), and a connection whose request the bearer did not
// admit (the metadata, a path not served, OPTIONS * included) is closed
// after the answer. A node's request bodies held by the gateway, each from
// its first byte read until its request ends, are bounded by
// HTTPOptions.MaxBodyBytesPerNode: the request that would pass it is
// refused at once with CodeTooManyBodyBytes, HTTP 429, and its connection
// closed. Over
// HTTP and over stdio, a
// node keeps at most Config.MaxCallsPerNode tool calls in flight through
// the gateway (its next is refused with CodeTooManyCalls, offline): every
// call is a BeginCall on the gateway's credential, whose rate budget all
// agents' calls share. Over HTTP a call (and a tools/list) counts until its
// answer is written to the agent, so that answers an agent does not read
// are held for no more than its calls in flight. Each call's progress is
// relayed to its agent on its own, the latest notification not yet written
// kept: an agent that does not read its stream holds up no other call's
// progress. Over HTTP a JSON-RPC batch is refused whole (400),
// before any of it runs. A call whose parameters, as forwarded, would
// exceed MaxForwardedParamsBytes (what MCP servers take) is refused with
// invalid params: the upstream's 413 would end the gateway's connection
// to it, for every agent. An upstream that fails in the transport is
// reported to the agent, and recorded in the ledger, by name only
// (CodeUnavailable); the gateway's log has the detail. An upstream's answer that would end the gateway's one
// connection to it (an HTTP error that is not a JSON-RPC one, an answer
// beyond MaxUpstreamAnswerBytes) fails only the call it answers
// (CodeUnavailable). An upstream whose connection ended all the same (a
// 404: its session is over) is reconnected (and its tools relisted);
// calls in flight on the old connection fail.
//
// # What passes through
//
// Arguments, results (including isError results), structured content,
// upstream JSON-RPC errors and progress notifications pass unchanged, and
// a call's _meta less the keys MCP reserves (io.modelcontextprotocol/…:
// the calling client's name, capabilities and protocol, which on the
// gateway's hop are the gateway's). Progress tokens are rewritten on the
// way up, to a random token per call, and restored on the way down, so
// that agents sharing an upstream
// never see each other's; progress from an upstream under a token the
// gateway did not issue for a call to that upstream is dropped. The
// agent's own token, which the gateway sends back with every notification
// of the call's progress, must be a string of at most
// MaxProgressTokenBytes or an integer of at most 2^53 (what the gateway can
// send back as it came): a call with any other is refused with invalid
// params before the ledger and the upstream. An
// upstream's JSON-RPC error whose code is in the gateway's own range
// (-32069 to -32061) is passed as an internal error (-32603) naming the
// upstream and its code, its message kept: those codes are the gateway's
// word (the agent is being stopped, its call cancelled, its grant
// revoked), never an upstream's. Resources, resource templates and prompts are refused explicitly
// (CodeNotGated): they would bypass the ledger, and a read is as much a
// tool call as a write. So is every method the gateway does not pass (it
// passes tools/list, tools/call and the session's own initialize, ping,
// logging/setLevel and notifications): subscriptions/listen, which the
// SDK's server answers in any session, held its request open, counted
// against nothing. Sampling and elicitation requests from upstreams are
// not forwarded.
//
// # Caller duties
//
// Run the Verifier (its Run) and the ToolGate before Start; Close the
// gateway, then the gate. A closed gateway's Handler refuses every
// request (503, CodeUnavailable; one past the door as Close began, as it
// reaches the MCP SDK's handler or the gateway's MCP server), and its
// ServeStdio ends the session and
// returns as it does at its context's end: its reports to the control
// plane are over. In HTTP mode serve Handler; in stdio mode call
// ServeStdio once per process.
package mcpgate
