// Package stoprule holds stop rules: named conditions, written in CEL, that
// say when an agent should stop. The agent proposes; the control plane
// decides. A rule is one input to the supervisor: when it becomes true for
// a node, the supervisor files a stop proposal naming the rule and the
// values that made it true, and the operator's proposal policy
// (supervisor.ProposalPolicy) decides whether anything happens.
//
// The pure core (env.go, cel.go, eval.go, attach.go, observe.go) has no
// store and no clock:
//   - Compile type-checks an expression against the documented
//     environment (`observed`, the control plane's own observations of the
//     node: Observations, which CEL knows by its API name
//     tether.v1.StopRuleObservations, so rules read as they always did;
//     `self_reported`, the agent's own counters; `subtree_reported`, those
//     counters added up over the node's subtree) and estimates its
//     worst-case cost with every map bounded (MaxTools, MaxCounters); a
//     rule over CostBudget is refused, and every refusal names the line and
//     column in the expression.
//   - Evaluate runs a compiled rule against one snapshot, stopped at
//     CostBudget, and reports the values the expression read, each marked
//     self-reported when it came from the agent.
//   - The attenuation rule: a node inherits the rules of its ancestors,
//     the selector rules matching an ancestor included (Applies,
//     InEffect); an agent attaches rules to itself and its
//     descendants only (CheckAttach) and removes only rules it or a
//     descendant set (CheckRemove), so a rule an ancestor or an operator
//     set is never removed or loosened by an agent (rules are never edited;
//     CheckName refuses a name already in effect, so an inherited rule
//     cannot be shadowed; a descendant's rule never keeps an ancestor,
//     nor an agent's an operator, from a
//     name, and a node's own rules, its ancestors' on it and operators'
//     count apart against MaxRulesPerNode and MaxAgentRuleCostPerNode, so
//     neither a node nor the workload can block the rules of those above).
//     Operators attach to any subtree and by label selector.
//   - ApplyCall and ApplySpawn fold ledger and tree changes into a node's
//     stored counters.
//
// The shell (rules.go, evaluator.go) is Rules:
//   - As the supervisor's Observer (set on Ledger.Observer and
//     Tree.Observer) it updates the counters inside the ledger's and the
//     tree's own transactions, so they are exactly what the ledger holds.
//     A spawn counts itself into one of 256 growth records of each
//     ancestor, chosen by the spawn's parent, rather than into the
//     ancestors' counters, so spawns under different parents share no
//     record but by a hash collision (the root's counters are not a hot
//     key); readers add the records up.
//   - Run is the level-triggered evaluator (leader-only). It watches the
//     rules, the counters and the tree and evaluates the rules in effect
//     at a node each time something a rule reads changes, never by polling
//     agents. Lease and revocation counts are read at evaluation time, and
//     only for rules that read them (the revocations charged to the tree's
//     turns a read more per grantsPerRead grants the node holds); those
//     rules, and rules that read the clock, are evaluated again every Tick
//     for the nodes they apply to (a tick walks the subtrees such rules are
//     attached to, and every node only for an operator's selector rule). Each time Run starts it compiles the
//     rules of the subtrees with a node still judged, not those of
//     subtrees wholly terminated (Add refuses a rule on a terminated
//     node), and it lets a node's rules go when the last running node of
//     its subtree terminates, and takes none read after that end (a rule
//     stored before the latest revision of the nodes it has read, on a
//     node with no running node below it).
//     A call still open counts its time up to the instant it is judged
//     (the node's own read from the ledger, its descendants' from their
//     shard totals: how many are open and their begin times added up; the
//     longest of them from the same records, each holding one call open
//     in its slot and the earliest of those it lists by begin time), so
//     rules on call time are evaluated again every Tick at the nodes
//     whose last evaluation found calls open in their subtree.
//   - subtree_calls_in_flight_max is the evaluator's own count (peak.go):
//     at a node where a rule reading it is in effect, it starts as soon
//     as the evaluator reads the rule or the node (startPeaks, before any
//     evaluation), from a snapshot, and takes each later change of the
//     node's records from its watch, in commit order, so a burst begun
//     and ended across the children between two evaluations is seen at
//     its peak; the changes taken between the moment the evaluator learns
//     a count is to start and its snapshot are kept (pendingPeak), and
//     the count starts at the highest level they reached (and for a node
//     spawned under such a rule, the changes of its records taken before
//     its spawn was read: unseen). The peak is kept in the store as it rises (stoprulespeak/,
//     which a new leader and TestStopRule read), and a pass ended by a
//     watch that fell behind hands its counts to the next (endPass).
//   - A rule that is true files its proposal and its fired mark in one
//     transaction (file), so it fires once per node, across crashes and
//     leader changes; the policy's decision, and the termination it
//     starts, are written in that same transaction.
//
// Rules and counters are the package's own types (types.go), stored in the
// protobuf encoding of the tether.v1 messages of the same names
// (internal/storecodec), so what any version stored reads back;
// controlplane/wire converts them to and from the API's messages.
//
// Caller duties, in order: set Rules as Observer on the Ledger and the Tree
// before serving; run Run as a leader-only component; map the package's
// sentinels (ErrInvalidRule, ErrOverBudget, ErrDenied, ErrRuleNotFound,
// ErrDuplicate, ErrLimit) to error codes at the edge; never let the
// workload write `observed` — self-reported counters go only through
// Report, and only for the reporting agent's own node.
package stoprule
