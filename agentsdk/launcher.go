package agentsdk

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Environment a Launcher gives the agent process it starts. The process
// joins with Join(ctx, os.Getenv(EnvAddr), os.Getenv(EnvCredential), nil).
const (
	EnvAddr       = "TETHER_ADDR"
	EnvCredential = "TETHER_CREDENTIAL"
	EnvNodeID     = "TETHER_NODE_ID"
	EnvVersion    = "TETHER_VERSION"
)

// Version is how to run one version of an agent.
type Version struct {
	// Name is the value of the version label, e.g. "v2".
	Name    string
	Command string
	Args    []string
	// Env is added to the launcher's own environment.
	Env []string
	// RunAs, when set, runs the version's processes as that user, with
	// that group and only the supplementary Groups listed (unix only; the
	// launcher needs the privilege to switch: root, or CAP_SETUID and
	// CAP_SETGID). Unset, they run as the launcher's own user, and any of
	// them can read the launcher's environment and, without Yama, its
	// memory — its operator token — and signal it, and read another
	// version's process's environment — that node's credential
	// (docs/design.md §11). Give the versions a user that is not the
	// launcher's, and versions that must not act as one another different
	// users.
	RunAs *User
}

// User is a user and its groups, by number.
type User struct {
	UID, GID uint32
	// Groups are the supplementary groups; none when empty.
	Groups []uint32
}

// LauncherConfig configures a Launcher.
type LauncherConfig struct {
	// Operator is an operator connection: the launcher registers each
	// agent process as a root node and confirms its exit with it — from
	// outside the process, which the record notes as "(launcher)".
	Operator *Conn
	// Name and Labels of every node the launcher registers; the version
	// label (VersionLabel, default "version") is set to the version run.
	Name   string
	Labels map[string]string
	// VersionLabel names the label that carries the version.
	VersionLabel string
	// Versions are the versions the launcher can run; Start is the first.
	Versions []Version
	Start    string
	// PollEvery is how often the launcher reads its nodes' state (default
	// 1s): the drain it reacts to is the control plane's stored state.
	PollEvery time.Duration
	// KillGrace is how long a process may outlive its node's termination
	// (or the launcher's shutdown) after SIGTERM before SIGKILL (default 10s).
	KillGrace time.Duration
	// WaitForExit starts the new version only once the old process has
	// exited (a restart); by default it starts as soon as the drain begins
	// (a surge), so the replacement is ready while the old one drains.
	WaitForExit    bool
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	// Clock times the pauses between restarts of an agent that dies
	// unasked (MinRestartBackoff), and the KillGrace between the SIGTERM
	// and the SIGKILL of a process its node's stop left running; nil means
	// WallClock. (The waits for the kernel to end and reap processes are
	// on the wall clock.)
	Clock Clock
	// Instance, when set, names this launcher among its own successive
	// runs (e.g. "host-1.planner"; a label value: letters, digits, '.',
	// '_', '-'). Every node it registers is labelled InstanceLabel=Instance,
	// and Run, before it starts anything, terminates (abort) every root
	// node with that label that no termination covers: nodes a previous
	// run registered (it crashed, was killed — by its agent, under its
	// user — or restarted) whose processes this run cannot see or attest,
	// which would otherwise stay running, their credentials alive, until
	// someone stopped them. Their records say unaccounted unless someone
	// attests their exits. Finding any, the first restart after an
	// unasked death backs off as a second one would. Two launchers that
	// run at once must not share an instance (each would stop the
	// other's agents when it starts): give a StateDir, and the second is
	// refused.
	Instance string
	// StateDir, when set (with an Instance; unix), is a directory only
	// the launcher's user may write, where the launcher keeps, per
	// instance, a lock and what its next run must know. Run takes the
	// instance's lock (<Instance>.lock, flock) and refuses to run while
	// another launcher holds it: two launchers of one instance no longer
	// stop each other's agents. It keeps its processes (pid, start,
	// node) and its restart backoff in <Instance>.state, and a run after
	// one that died (crashed, killed, restarted without stopping its
	// agents) kills the processes its predecessor left that still run
	// (Linux: a pid is taken for the same process only if its start
	// matches) and, if the predecessor started an agent less than
	// MaxRestartBackoff before, waits the backoff the predecessor would
	// have waited before its first start, doubling it: a crash loop that
	// kills its launcher is paced as one that does not.
	StateDir string
}

// InstanceLabel is the label on every node a launcher with an Instance
// registers.
const InstanceLabel = "tether.dev/launcher"

// RegistrationLabel is the label on every node a launcher registers that
// names its registration (a random id, one per RegisterRoot call): a
// registration whose answer was lost is found by it and terminated.
const RegistrationLabel = "tether.dev/registration"

// Restart backoff: an agent that dies unasked (or claims its exit, or is
// drained by the stop policy alone) is restarted at once the first time;
// if it dies again within MaxRestartBackoff of its start, the launcher
// waits MinRestartBackoff before the next restart, doubling up to
// MaxRestartBackoff, so a crash loop costs the control plane a node, a
// termination and a record per pause, not per crash. A rollout's or an
// operator's drain's replacement is never held back, but a start that
// fails (a replacement's or a restart's) is due again after the backoff
// rather than dropped.
const (
	MinRestartBackoff = time.Second
	MaxRestartBackoff = time.Minute
)

// Launcher runs an agent process and, when the control plane drains its
// node (a rollout batch, or any termination), starts the target version in
// a new process registered as a new node, and confirms the old process's
// exit. A process that exits without a drain is confirmed too, its node is
// terminated (abort) so that its grants and leases are reconciled, and it
// is restarted at the target version. So is a node whose exit was claimed
// outside any termination (the agent's own Exit): a claim is not a drain,
// and a process that claimed its exit and runs on is stopped (SIGTERM,
// then SIGKILL after KillGrace) before its exit is confirmed. Restarts
// after such deaths back off (MinRestartBackoff): a crash loop is not
// restarted as fast as it dies. So do those after a drain the control
// plane's stop policy started on its own (the agent's own stop proposal, or
// a stop rule, approved by no operator): a crash loop proposing its own
// stop before dying is not restarted as fast either. With an Instance, Run
// first terminates the nodes a previous run of the launcher left
// (LauncherConfig.Instance); with a StateDir as well it first claims the
// instance, refusing to run beside another launcher of it, kills the
// processes a previous run that died left, and carries the restart
// backoff across runs (LauncherConfig.StateDir).
//
// It sees a process's exit when the process exits: output to a Stdout or
// Stderr that is not a file goes through a pipe the launcher copies
// itself, so an escapee holding it does not hide the exit.
//
// The exit it confirms is the agent's, not only its first process's. Each
// process runs in a session — and so a process group — of its own (unix:
// no controlling terminal, so an agent cannot type into its launcher's),
// which the launcher
// kills when the process exits; it signals the process as well as its
// group, which the process may have left. On Linux the launcher's process also
// becomes a child subreaper (PR_SET_CHILD_SUBREAPER, for the whole
// program, from the first launch): whatever the agent leaves outside its
// group (setsid or setpgid, then a double fork) is reparented to it rather
// than to init. After the agent's process exits, the launcher kills
// (SIGKILL) and reaps every child of its process that started at or after
// the agent's process and that no os.Process of the program holds — the
// program's own children started with os/exec or os.StartProcess, and the
// other agents' processes, are held by a pidfd until they are waited for
// — with everything below it, and each one's process group when every
// member of it is such a process's (a process forking and exiting in a
// loop outruns kills by pid, not a group's); and it confirms the exit only once a scan of
// /proc finds none left. If that cannot be proven (no subreaper; no pidfds,
// so the program's children cannot be told from orphans; a process still
// there after KillGrace) it does not confirm, and the node's record says
// unaccounted. Such an orphan may also be another live agent's (one that
// escaped its own group) or a child the program started otherwise
// (syscall.ForkExec, cgo): it is killed all the same. Outside Linux only
// the group (unix) or the process is reached (docs/design.md §11).
type Launcher struct {
	cfg      LauncherConfig
	versions map[string]Version

	// exits is signalled when a process exits, so Run acts at once.
	exits chan struct{}

	mu     sync.Mutex
	target string
	procs  []*launched

	// Restarts after unasked deaths (Run's goroutine only): the next
	// pause, and the restarts waiting for restartAt.
	backoff     time.Duration
	restartAt   time.Time
	restartsDue int
	// lastStart is the last agent start, on the Clock; stateSaved what
	// was last written to the StateDir (Run's goroutine only).
	lastStart  time.Time
	stateSaved []byte
	// lost are the registrations (RegistrationLabel values) whose
	// answer was an error, not yet looked for (Run's goroutine only).
	lost []string
}

// launched is one agent process and its node.
type launched struct {
	version string
	node    string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	// orphans finds what the process left behind outside its group;
	// gone is nil once that is proven gone (sweepOrphans).
	orphans orphanWatch
	gone    error
	// drained: the node's drain was seen (its successor was started or
	// is due); confirmed: the exit was confirmed.
	drained, confirmed bool
	// unasked: the process died (or its exit was claimed) without a
	// drain; its restart is subject to the backoff.
	unasked bool
	// startedAt is when it started, on the launcher's Clock; pidStart
	// when, by the system's count (Linux; 0 elsewhere), for a later run
	// to tell the process from another that has its pid.
	startedAt time.Time
	pidStart  uint64
	// liar: the node's exit was claimed outside any termination while
	// the process ran on; the launcher terminated the node and stops the
	// process.
	liar         bool
	terminatedAt time.Time
}

// NewLauncher validates cfg.
func NewLauncher(cfg LauncherConfig) (*Launcher, error) {
	if cfg.Operator == nil {
		return nil, errors.New("agentsdk: Launcher needs an operator connection")
	}
	if cfg.Name == "" {
		return nil, errors.New("agentsdk: Launcher needs a node name")
	}
	if cfg.VersionLabel == "" {
		cfg.VersionLabel = "version"
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = time.Second
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = WallClock
	}
	l := &Launcher{cfg: cfg, versions: map[string]Version{}, target: cfg.Start, exits: make(chan struct{}, 1)}
	for _, v := range cfg.Versions {
		if v.Name == "" || v.Command == "" {
			return nil, errors.New("agentsdk: every launcher version needs a name and a command")
		}
		if v.RunAs != nil && !canRunAs {
			return nil, fmt.Errorf("agentsdk: version %q names a user to run as, which this platform's launcher cannot do", v.Name)
		}
		l.versions[v.Name] = v
	}
	if cfg.StateDir != "" && cfg.Instance == "" {
		return nil, errors.New("agentsdk: a launcher StateDir needs an Instance, the name its state is kept under")
	}
	if cfg.StateDir != "" && !canKeepState {
		return nil, errors.New("agentsdk: a launcher StateDir needs unix")
	}
	if _, ok := l.versions[cfg.Start]; !ok {
		return nil, fmt.Errorf("agentsdk: start version %q is not among the launcher's versions", cfg.Start)
	}
	return l, nil
}

// SetTarget sets the version started at the next drain (or unexpected
// exit). Set it before a rollout drains this launcher's agent.
func (l *Launcher) SetTarget(version string) error {
	if _, ok := l.versions[version]; !ok {
		return fmt.Errorf("agentsdk: version %q is not among the launcher's versions", version)
	}
	l.mu.Lock()
	l.target = version
	l.mu.Unlock()
	return nil
}

// Current returns the node id and version of the newest process.
func (l *Launcher) Current() (nodeID, version string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.procs) == 0 {
		return "", ""
	}
	p := l.procs[len(l.procs)-1]
	return p.node, p.version
}

// Run starts the first process and supervises until ctx ends; then it
// stops the processes (SIGTERM, then SIGKILL to those still running after
// one KillGrace for them all), confirms
// their exits and terminates (abort) their nodes that no termination
// covered, so what they and their descendants hold is revoked and their
// records written (rogue39l test).
func (l *Launcher) Run(ctx context.Context) error {
	release, err := l.claimInstance()
	if err != nil {
		return err
	}
	defer release()
	pause, err := l.takeOver()
	if err != nil {
		return err
	}
	if err := l.endPredecessors(ctx); err != nil {
		return err
	}
	tick := time.NewTicker(l.cfg.PollEvery)
	defer tick.Stop()
	if pause > 0 {
		// The previous run died soon after it started an agent: this
		// start is a restart, and waits as the dead run would have.
		l.cfg.Log.Warn("waiting before starting the agent: the launcher's previous run died", "instance", l.cfg.Instance, "backoff", pause)
		for startAt := l.cfg.Clock.Now().Add(pause); l.cfg.Clock.Now().Before(startAt); {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	}
	if err := l.launch(ctx, l.cfg.Start); err != nil {
		return err
	}
	defer func() {
		l.stopAll()
		if err := l.saveState(true); err != nil {
			l.cfg.Log.Warn("could not record the launcher's clean stop", "error", err)
		}
	}()
	for {
		if err := l.step(ctx); err != nil && ctx.Err() == nil {
			l.cfg.Log.Warn("launcher step failed; retrying", "error", err)
		}
		if err := l.saveState(false); err != nil {
			l.cfg.Log.Warn("could not record the launcher's state", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-l.exits:
		}
	}
}

// step reads each live process's node and acts on what the control plane
// decided and what the processes did.
func (l *Launcher) step(ctx context.Context) error {
	l.mu.Lock()
	procs := append([]*launched(nil), l.procs...)
	l.mu.Unlock()
	var errs []error
	if len(l.lost) > 0 {
		errs = append(errs, l.endLost(ctx))
	}
	if l.restartsDue > 0 && !l.cfg.Clock.Now().Before(l.restartAt) {
		l.restartsDue--
		errs = append(errs, l.launchOrRetry(ctx))
	}
	for _, p := range procs {
		if p.confirmed {
			continue
		}
		node, err := l.cfg.Operator.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: p.node}))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		state := node.Msg.Node.State
		exited := isClosed(p.exited)
		// A node whose exit was claimed (by the agent, or confirmed by
		// someone else) outside any termination is not being drained: an
		// exit is a word, not a stop — nothing the node holds is revoked
		// and no record is written until a termination covers it.
		claimed := state == tetherv1.NodeState_NODE_STATE_EXITED && node.Msg.Node.TerminationId == ""
		switch {
		case !p.drained && state != tetherv1.NodeState_NODE_STATE_RUNNING && !claimed:
			// The control plane drains (or aborts) the node: bring up the
			// target version, now or once the old process is gone.
			// A drain the control plane's policy started on its own (the
			// agent's own stop proposal, or a stop rule, approved by no
			// operator) is the workload's choice: its restart backs off as
			// an unasked death's does, or a crash loop proposing its own
			// stop before dying dodged the backoff (rogue36k test).
			policy, err := l.policyStop(ctx, node.Msg.Node.TerminationId)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.drained, p.unasked = true, policy
			l.cfg.Log.Info("agent draining; replacing it", "node_id", p.node, "version", p.version)
			switch {
			case l.cfg.WaitForExit:
			case policy:
				errs = append(errs, l.restartUnasked(ctx, p))
			default:
				errs = append(errs, l.launchOrRetry(ctx))
			}
		case !p.drained && (exited || claimed):
			// An exit nobody asked for: terminate the node so what it held
			// is revoked and reconciled, then restart. An exit claimed
			// while the process runs on is a lie the launcher can see (it
			// holds the process): the process is stopped too, and its exit
			// confirmed once it is gone.
			p.drained, p.unasked = true, true
			reason := fmt.Sprintf("agent process exited unexpectedly: %v", p.waitErr)
			if exited {
				l.cfg.Log.Warn("agent exited unexpectedly; terminating its node and restarting", "node_id", p.node, "error", p.waitErr)
			} else {
				p.liar = true
				reason = "the agent's exit was claimed but its process runs on"
				l.cfg.Log.Warn("agent's exit was claimed but its process runs on; terminating its node, stopping it and restarting", "node_id", p.node, "version", p.version)
			}
			_, err := l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: p.node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: reason,
			}))
			if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
				errs = append(errs, err)
			}
			if !l.cfg.WaitForExit {
				errs = append(errs, l.restartUnasked(ctx, p))
			}
		}
		if p.drained && exited {
			if err := l.proveGone(p); err != nil {
				// Not proven gone: the exit is not confirmed (the node
				// stays unaccounted rather than be called confirmed).
				errs = append(errs, fmt.Errorf("the exit of %s is not confirmed: %w", p.node, err))
				continue
			}
			if err := l.confirm(ctx, p); err != nil {
				errs = append(errs, err)
				continue
			}
			if l.cfg.WaitForExit && p.unasked {
				errs = append(errs, l.restartUnasked(ctx, p))
			} else if l.cfg.WaitForExit {
				errs = append(errs, l.launchOrRetry(ctx))
			}
			continue
		}
		if (state == tetherv1.NodeState_NODE_STATE_TERMINATED || p.liar) && !exited {
			// The record is written (or the node's exit was claimed while
			// the process runs on); a process still running has no
			// credential left. Stop it.
			if p.terminatedAt.IsZero() {
				p.terminatedAt = l.cfg.Clock.Now()
				signalGroup(p.cmd, syscall.SIGTERM)
			} else if l.cfg.Clock.Now().Sub(p.terminatedAt) > l.cfg.KillGrace {
				signalGroup(p.cmd, syscall.SIGKILL)
			}
		}
	}
	return errors.Join(errs...)
}

// endPredecessors terminates (abort) the root nodes labelled with the
// launcher's Instance that no termination covers: a previous run's (rogue37h
// test). Only roots are read: only operators register them, while any
// agent may label a child as it likes.
func (l *Launcher) endPredecessors(ctx context.Context) error {
	if l.cfg.Instance == "" {
		return nil
	}
	var token string
	found := 0
	walk := newPageWalk("ListNodes of launcher instance "+strconv.Quote(l.cfg.Instance), "")
	for {
		resp, err := l.cfg.Operator.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{
			LabelSelector: InstanceLabel + "=" + l.cfg.Instance, OneLevel: true, PageToken: token,
		}))
		if err != nil {
			return fmt.Errorf("agentsdk: list the nodes of launcher instance %q: %w", l.cfg.Instance, err)
		}
		for _, n := range resp.Msg.Nodes {
			if n.ParentNodeId != "" || n.TerminationId != "" || n.State == tetherv1.NodeState_NODE_STATE_TERMINATED {
				continue
			}
			found++
			l.cfg.Log.Warn("terminating a node a previous run of this launcher left", "node_id", n.NodeId, "instance", l.cfg.Instance)
			_, err := l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: n.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
				Reason: "a previous run of its launcher (instance " + l.cfg.Instance + ") left it; the launcher restarted and cannot see its process",
			}))
			if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
				return fmt.Errorf("agentsdk: terminate node %s of a previous run of launcher instance %q: %w", n.NodeId, l.cfg.Instance, err)
			}
		}
		token = resp.Msg.NextPageToken
		if token == "" {
			break
		}
		// A page named again (a path to the control plane that cycles
		// its pages) would keep the launcher from ever starting.
		if err := walk.next(token); err != nil {
			return err
		}
	}
	if found > 0 {
		// A restarted launcher is a restart: the first unasked death
		// after it waits, as the second one would (or longer, as its
		// StateDir says).
		l.backoff = max(l.backoff, MinRestartBackoff)
	}
	return nil
}

// proveGone returns nil once nothing p's process left behind runs: the
// sweep after its exit found nothing left, or a new sweep does.
func (l *Launcher) proveGone(p *launched) error {
	l.mu.Lock()
	gone := p.gone
	l.mu.Unlock()
	if gone == nil {
		return nil
	}
	gone = sweepOrphans(p.orphans, time.Now().Add(l.cfg.PollEvery))
	l.mu.Lock()
	p.gone = gone
	l.mu.Unlock()
	return gone
}

// confirm tells the control plane the process exited, with the operator
// token: the record notes "(launcher)". The caller has proven the process
// and what it left behind gone (proveGone).
func (l *Launcher) confirm(ctx context.Context, p *launched) error {
	reason := "process exited"
	if p.waitErr != nil {
		reason = "process exited: " + p.waitErr.Error()
	}
	if _, err := l.cfg.Operator.Agent.ConfirmExit(ctx, connect.NewRequest(&tetherv1.ConfirmExitRequest{NodeId: p.node, Reason: reason})); err != nil {
		return fmt.Errorf("confirm exit of %s: %w", p.node, err)
	}
	l.mu.Lock()
	p.confirmed = true
	l.mu.Unlock()
	l.cfg.Log.Info("agent exit confirmed", "node_id", p.node, "version", p.version)
	return nil
}

// policyStop reports whether termination id was started by the control
// plane's stop policy (its requester PolicyDecider's), not by an operator,
// an ancestor or a rollout.
func (l *Launcher) policyStop(ctx context.Context, id string) (bool, error) {
	if id == "" {
		return false, nil
	}
	resp, err := l.cfg.Operator.Supervisor.GetTermination(ctx, connect.NewRequest(&tetherv1.GetTerminationRequest{TerminationId: id}))
	if err != nil {
		return false, err
	}
	return strings.HasPrefix(resp.Msg.Termination.RequestedBy, supervisorPolicyDecider), nil
}

// supervisorPolicyDecider is supervisor.PolicyDecider, the requester of a
// termination the stop policy approved on its own.
const supervisorPolicyDecider = "policy:"

// restartUnasked starts the target version after p died unasked: at once
// when p ran for MaxRestartBackoff or more, or when it is the first such
// death since; otherwise after the backoff (the next step past restartAt),
// which doubles up to MaxRestartBackoff. Run's goroutine only.
func (l *Launcher) restartUnasked(ctx context.Context, p *launched) error {
	now := l.cfg.Clock.Now()
	if now.Sub(p.startedAt) >= MaxRestartBackoff {
		l.backoff = 0
	}
	if l.backoff == 0 {
		l.backoff = MinRestartBackoff
		return l.launchOrRetry(ctx)
	}
	l.cfg.Log.Warn("waiting before restarting the agent", "node_id", p.node, "backoff", l.backoff)
	l.restartLater()
	return nil
}

// restartLater makes one start of the target version due after the
// current backoff (at least MinRestartBackoff), which then doubles up to
// MaxRestartBackoff. Run's goroutine only.
func (l *Launcher) restartLater() {
	now := l.cfg.Clock.Now()
	pause := max(l.backoff, MinRestartBackoff)
	if l.restartsDue == 0 || now.Add(pause).After(l.restartAt) {
		l.restartAt = now.Add(pause)
	}
	l.restartsDue++
	l.backoff = min(2*pause, MaxRestartBackoff)
}

// launchOrRetry starts the target version; a start that fails (the
// control plane unreachable, the executable not there, the user's
// process limit spent) is due again after the backoff rather than
// dropped, or a drained node would never be replaced (rogue37h test).
// Run's goroutine only.
func (l *Launcher) launchOrRetry(ctx context.Context) error {
	err := l.launchTarget(ctx)
	if err != nil && ctx.Err() == nil {
		l.restartLater()
		err = fmt.Errorf("%w (trying again after the restart backoff)", err)
	}
	return err
}

func (l *Launcher) launchTarget(ctx context.Context) error {
	l.mu.Lock()
	target := l.target
	l.mu.Unlock()
	return l.launch(ctx, target)
}

// launch registers a node for version and starts its process with the
// node's credential in the environment.
func (l *Launcher) launch(ctx context.Context, version string) error {
	v := l.versions[version]
	labels := maps.Clone(l.cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[l.cfg.VersionLabel] = version
	if l.cfg.Instance != "" {
		labels[InstanceLabel] = l.cfg.Instance
	}
	reg := rand.Text()
	labels[RegistrationLabel] = reg
	resp, err := l.cfg.Operator.Agent.RegisterRoot(ctx, connect.NewRequest(&tetherv1.RegisterRootRequest{Name: l.cfg.Name, Labels: labels}))
	if err != nil {
		// The control plane may have registered the root and the
		// answer been lost: a root with no process, its credential
		// alive. Look for it and terminate it (now, or in a later
		// step), whatever the retry does (rogue38h test).
		l.lost = append(l.lost, reg)
		if cerr := l.endLost(ctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return fmt.Errorf("register %s: %w", version, err)
	}
	node := resp.Msg.Node.NodeId
	cmd := exec.Command(v.Command, v.Args...)
	// Not the launcher's own TETHER_ variables: a program takes its
	// operator token from there ($TETHER_TOKEN), and the agent gets its
	// node's credential, never an operator's.
	inherited := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TETHER_") })
	cmd.Env = append(append(inherited, v.Env...),
		EnvAddr+"="+l.cfg.Operator.BaseURL, EnvCredential+"="+resp.Msg.Credential, EnvNodeID+"="+node, EnvVersion+"="+version)
	// The process's output goes to a file the launcher hands it, never to
	// a pipe os/exec copies: Wait would wait for that copy to end, for
	// every process holding the pipe — an escapee in a session of its own
	// included — and the agent's exit would go unseen (rogue38h test).
	closeAfterStart, err := l.wireOutput(cmd)
	if err != nil {
		for _, f := range closeAfterStart {
			_ = f.Close()
		}
		_, _ = l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
			NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "agent process failed to start",
		}))
		return fmt.Errorf("start %s: %w", version, err)
	}
	ownGroup(cmd)
	runAs(cmd, v.RunAs)
	// On Linux the launcher's process adopts orphans from before the
	// agent starts (adoptOrphans): adopted only once it had started, an
	// agent's setsid and double fork done at once could leave its escapee
	// to init, out of the sweep's reach, on the program's first launch.
	adoptOrphans()
	err = cmd.Start()
	for _, f := range closeAfterStart {
		_ = f.Close()
	}
	if err != nil {
		// The node never ran: terminate it so it is not left running.
		_, _ = l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
			NodeId: node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "agent process failed to start",
		}))
		return fmt.Errorf("start %s: %w", version, err)
	}
	// Before the process is waited for: /proc knows it even if it exited.
	p := &launched{version: version, node: node, cmd: cmd, exited: make(chan struct{}), orphans: watchOrphans(cmd.Process.Pid), startedAt: l.cfg.Clock.Now(), pidStart: procStart(cmd.Process.Pid)}
	l.lastStart = p.startedAt
	if p.orphans.err != nil {
		l.cfg.Log.Warn("the launcher cannot prove what the agent leaves behind gone; its exit will not be confirmed", "node_id", node, "error", p.orphans.err)
	}
	go func() {
		err := cmd.Wait()
		// The exit the launcher attests is the agent's: what its process
		// left behind in its group (a background child, holding the
		// node's credential) goes with it, before anyone is told; and on
		// Linux so does what left the group (setsid and a double fork),
		// which the launcher's process adopted as a subreaper.
		signalGroup(cmd, syscall.SIGKILL)
		gone := sweepOrphans(p.orphans, time.Now().Add(l.cfg.KillGrace))
		if gone != nil {
			l.cfg.Log.Warn("what the agent left behind is not proven gone", "node_id", node, "error", gone)
		}
		l.mu.Lock()
		p.waitErr = err
		p.gone = gone
		l.mu.Unlock()
		close(p.exited)
		select {
		case l.exits <- struct{}{}:
		default:
		}
	}()
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	// Recorded at once, for a next run to kill it should this one die.
	if err := l.saveState(false); err != nil {
		l.cfg.Log.Warn("could not record the launcher's state", "error", err)
	}
	l.cfg.Log.Info("agent started", "node_id", node, "version", version, "pid", cmd.Process.Pid)
	return nil
}

// wireOutput sets cmd's Stdout and Stderr from the launcher's: a writer
// that is a file (or none) is handed to the process as it is; any other
// gets a pipe whose write end the process is handed as a file, and a
// goroutine of the launcher's copies what is written to it until every
// holder has closed it. os/exec would copy it too, but its Wait would
// not return before the copy ended. It returns the write ends to close
// once the process has started (or failed to).
func (l *Launcher) wireOutput(cmd *exec.Cmd) ([]*os.File, error) {
	var opened []*os.File
	wire := func(w io.Writer) (io.Writer, error) {
		if w == nil {
			return nil, nil
		}
		if f, ok := w.(*os.File); ok {
			return f, nil
		}
		r, pw, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("agentsdk: a pipe for the agent's output: %w", err)
		}
		opened = append(opened, pw)
		go func() {
			_, _ = io.Copy(w, r)
			_ = r.Close()
		}()
		return pw, nil
	}
	var err error
	if cmd.Stdout, err = wire(l.cfg.Stdout); err != nil {
		return opened, err
	}
	if sameWriter(l.cfg.Stderr, l.cfg.Stdout) {
		cmd.Stderr = cmd.Stdout
		return opened, nil
	}
	cmd.Stderr, err = wire(l.cfg.Stderr)
	return opened, err
}

// sameWriter reports whether a and b are one writer (as os/exec tells it:
// a writer of a type that cannot be compared is not).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() { _ = recover() }()
	return a != nil && a == b
}

// endLost looks for the roots of the registrations whose answer was an
// error (by their RegistrationLabel) and terminates (abort) each that no
// termination covers; a registration is forgotten once looked for.
func (l *Launcher) endLost(ctx context.Context) error {
	var errs []error
	keep := l.lost[:0]
	for _, reg := range l.lost {
		resp, err := l.cfg.Operator.Agent.ListNodes(ctx, connect.NewRequest(&tetherv1.ListNodesRequest{
			LabelSelector: RegistrationLabel + "=" + reg, OneLevel: true,
		}))
		if err != nil {
			keep = append(keep, reg)
			errs = append(errs, fmt.Errorf("look for the root of a registration whose answer was lost: %w", err))
			continue
		}
		ended := true
		for _, n := range resp.Msg.Nodes {
			if n.ParentNodeId != "" || n.TerminationId != "" || n.State == tetherv1.NodeState_NODE_STATE_TERMINATED {
				continue
			}
			l.cfg.Log.Warn("terminating a root whose registration's answer was lost", "node_id", n.NodeId)
			_, err := l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: n.NodeId, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT,
				Reason: "its launcher's registration of it got no answer; no process runs it",
			}))
			if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
				ended = false
				errs = append(errs, fmt.Errorf("terminate %s, whose registration's answer was lost: %w", n.NodeId, err))
			}
		}
		if !ended {
			keep = append(keep, reg)
		}
	}
	l.lost = keep
	return errors.Join(errs...)
}

// stopAll ends every process still running, confirms the exits and
// terminates (abort) the nodes no termination covered yet.
func (l *Launcher) stopAll() {
	l.mu.Lock()
	procs := append([]*launched(nil), l.procs...)
	l.mu.Unlock()
	for _, p := range procs {
		if !isClosed(p.exited) {
			signalGroup(p.cmd, syscall.SIGTERM)
		}
	}
	// One KillGrace for them all, then SIGKILL for each still running,
	// before any exit is confirmed: waiting up to KillGrace for each in
	// turn, a set of processes deaf to SIGTERM (a rogue drained for a new
	// version runs on, beside its replacement) multiplied the shutdown,
	// their credentials alive until each was killed (rogue40k test).
	grace := time.NewTimer(l.cfg.KillGrace)
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-grace.C:
			for _, q := range procs {
				if !isClosed(q.exited) {
					signalGroup(q.cmd, syscall.SIGKILL)
				}
			}
			<-p.exited
		}
	}
	grace.Stop()
	for _, p := range procs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if !p.confirmed {
			if err := l.proveGone(p); err != nil {
				l.cfg.Log.Warn("not confirming an agent's exit: what it left behind is not proven gone", "node_id", p.node, "error", err)
			} else if err := l.confirm(ctx, p); err != nil {
				l.cfg.Log.Warn("could not confirm an agent's exit", "node_id", p.node, "error", err)
			}
		}
		if !p.drained {
			// A confirmed exit outside a termination is a word, not a
			// stop: nothing the node holds would be revoked, no record
			// written, and its descendants — their credentials wherever
			// the agent handed them — would run on (rogue39l test). The
			// node is terminated, proven gone or not.
			_, err := l.cfg.Operator.Supervisor.Terminate(ctx, connect.NewRequest(&tetherv1.TerminateRequest{
				NodeId: p.node, Mode: tetherv1.TerminationMode_TERMINATION_MODE_ABORT, Reason: "its launcher stopped",
			}))
			if err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
				l.cfg.Log.Warn("could not terminate the node of an agent the launcher stopped", "node_id", p.node, "error", err)
			}
		}
		cancel()
	}
	if len(l.lost) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := l.endLost(ctx); err != nil {
			l.cfg.Log.Warn("could not end a root whose registration's answer was lost", "error", err)
		}
		cancel()
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
