package lease_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherhq/tether/supervisor/lease"
)

// Transcript tests replay lease scenarios from testdata/*.txt. The format is
// line based; '#' starts a comment line.
//
//	policy ack_miss=reassign ack_timeout=5s ...   override DefaultPolicy (before any message)
//	load gen=7 lease=L7 holder=w1 state=ACTIVE ... start from a stored lease instead of an Offer
//	at 10s renew lease=L1 gen=1 holder=w1 seq=3    step a message at epoch+10s ("+5s": 5s after the last one)
//	=> REJECTED STALE_GENERATION                   the decision (required after every message)
//	err ErrStaleGeneration                         errors.Is(decision.Err(), sentinel)
//	events LEASE_EXPIRED:ACTIVE->EXPIRED RENEWED    the exact events (AUDIT:FROM->TO for a transition, else AUDIT)
//	reason ~ some text                             the reason contains the text
//	state gen=8 holder=w2 expires_at=40s ...       lease fields after the step ("-" for an unset time)
//	evidence decision="REJECTED STALE_GENERATION"  columns of the step's evidence row, snake_case header names
//
// Message arguments: job (default j1), lease, gen (a worker's claim, or the
// generation a request_cancel, reassign or resolve names), holder, seq, value, sent,
// result, detail, duration, ack_timeout, owner, reason, bound,
// resolve_conflict, automatic, holder_unavailable, last_alive, extend_to.
// auto_reassign lease=L2 holder=w1 steps lease.AutomaticReassign of the
// lease under the transcript's policy (holder_unavailable="…" sets the
// shell's word that the holder cannot take work). Times are offsets from
// the transcript epoch, or absolute RFC 3339 dates (for times no offset
// reaches). Every step is also checked against the invariants in checkStep.
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no transcripts in testdata")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runTranscript(t, file)
		})
	}
}

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

type transcript struct {
	t      *testing.T
	file   string
	line   int
	policy lease.Policy
	lease  lease.Lease
	now    time.Time

	stepped  bool // a message was stepped
	expected bool // ... and its decision was checked
	decision lease.Decision
	events   []lease.Event
	row      lease.EvidenceRow
}

func runTranscript(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := &transcript{t: t, file: file, policy: lease.DefaultPolicy(), now: epoch}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		tr.line++
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := tr.exec(line); err != nil {
			t.Fatalf("%s:%d: %s\n\t%v", file, tr.line, line, err)
		}
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	if !tr.stepped {
		t.Fatalf("%s: no messages", file)
	}
	if !tr.expected {
		t.Fatalf("%s: last message has no => expectation", file)
	}
}

func (tr *transcript) exec(line string) error {
	verb, rest, _ := strings.Cut(line, " ")
	rest = strings.TrimSpace(rest)
	if verb != "at" && verb != "policy" && verb != "load" && !tr.stepped {
		return errors.New("check before any message")
	}
	switch verb {
	case "policy":
		if tr.stepped {
			return errors.New("policy after a message")
		}
		return tr.setPolicy(rest)
	case "load":
		if tr.stepped {
			return errors.New("load after a message")
		}
		return tr.load(rest)
	case "at":
		if tr.stepped && !tr.expected {
			return errors.New("previous message has no => expectation")
		}
		return tr.step(rest)
	case "=>":
		tr.expected = true
		want := strings.Fields(rest)
		got := []string{tr.decision.Outcome.String(), tr.decision.Event.String()}
		if strings.Join(want, " ") != strings.Join(got, " ") {
			return fmt.Errorf("decision %s %s, want %s\n\treason: %s", got[0], got[1], rest, tr.decision.Reason)
		}
	case "err":
		sentinel, ok := sentinels[rest]
		if !ok {
			return fmt.Errorf("unknown sentinel %q", rest)
		}
		if !errors.Is(tr.decision.Err(), sentinel) {
			return fmt.Errorf("decision error %v, want %s", tr.decision.Err(), rest)
		}
	case "events":
		var got []string
		for _, e := range tr.events {
			if !e.Transition {
				got = append(got, e.Audit.String())
			} else {
				got = append(got, fmt.Sprintf("%s:%s->%s", e.Audit, e.From, e.To))
			}
		}
		if strings.Join(got, " ") != strings.Join(strings.Fields(rest), " ") {
			return fmt.Errorf("events %s, want %s", strings.Join(got, " "), rest)
		}
	case "reason":
		text, ok := strings.CutPrefix(rest, "~ ")
		if !ok {
			return errors.New(`want "reason ~ text"`)
		}
		if !strings.Contains(tr.decision.Reason, text) {
			return fmt.Errorf("reason %q does not contain %q", tr.decision.Reason, text)
		}
	case "state":
		return tr.checkState(rest)
	case "evidence":
		return tr.checkEvidence(rest)
	default:
		return fmt.Errorf("unknown directive %q", verb)
	}
	return nil
}

func (tr *transcript) step(rest string) error {
	when, rest, _ := strings.Cut(rest, " ")
	now, err := tr.parseTime(when)
	if err != nil {
		return err
	}
	kind, rest, _ := strings.Cut(strings.TrimSpace(rest), " ")
	args, err := parseArgs(rest)
	if err != nil {
		return err
	}
	var m lease.Message
	if kind == "auto_reassign" {
		// The automatic reassignment a shell steps when ReassignDue says
		// so, as lease.AutomaticReassign builds it from the lease and the
		// policy of the transcript.
		a := newArgReader(args)
		r := lease.AutomaticReassign(tr.lease, tr.policy, a.str("lease", ""), a.str("holder", ""))
		r.HolderUnavailable = a.str("holder_unavailable", "")
		m = r
		err = a.done()
	} else {
		m, err = buildMessage(kind, args)
	}
	if err != nil {
		return err
	}
	tr.now = now
	pre := tr.lease
	post, d, events := lease.Step(pre, m, now, tr.policy)
	if err := checkStep(pre, m, now, post, d, events); err != nil {
		return fmt.Errorf("invariant: %v\n\tdecision: %s", err, d)
	}
	again, d2, events2 := lease.Step(pre, m, now, tr.policy)
	if again != post || d2 != d || fmt.Sprint(events2) != fmt.Sprint(events) {
		return errors.New("Step is not deterministic")
	}
	tr.lease, tr.decision, tr.events = post, d, events
	tr.row = lease.NewEvidenceRow(post, m, d, now)
	tr.stepped, tr.expected = true, false
	return nil
}

// parseTime reads "10s" (epoch + 10s) or "+5s" (5s after the last step).
func (tr *transcript) parseTime(s string) (time.Time, error) {
	if rel, ok := strings.CutPrefix(s, "+"); ok {
		d, err := time.ParseDuration(rel)
		return tr.now.Add(d), err
	}
	return offsetTime(s)
}

func offsetTime(s string) (time.Time, error) {
	if s == "-" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil // an absolute date, for times no offset reaches
	}
	d, err := time.ParseDuration(s)
	return epoch.Add(d), err
}

func formatOffset(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Sub(epoch).String()
}

var sentinels = map[string]error{
	"ErrInvalidMessage":       lease.ErrInvalidMessage,
	"ErrInvalidPolicy":        lease.ErrInvalidPolicy,
	"ErrUnknownLease":         lease.ErrUnknownLease,
	"ErrInvalidTransition":    lease.ErrInvalidTransition,
	"ErrStaleGeneration":      lease.ErrStaleGeneration,
	"ErrFutureGeneration":     lease.ErrFutureGeneration,
	"ErrHolderMismatch":       lease.ErrHolderMismatch,
	"ErrOwnershipConflict":    lease.ErrOwnershipConflict,
	"ErrLeaseExpired":         lease.ErrLeaseExpired,
	"ErrAckDeadlineMissed":    lease.ErrAckDeadlineMissed,
	"ErrStaleSequence":        lease.ErrStaleSequence,
	"ErrLateProgress":         lease.ErrLateProgress,
	"ErrConflictingDuplicate": lease.ErrConflictingDuplicate,
	"ErrCancelRequested":      lease.ErrCancelRequested,
	"ErrTerminal":             lease.ErrTerminal,
	"ErrNotDue":               lease.ErrNotDue,
}

// parseArgs splits `k=v k2="v w"` into a map, rejecting repeats.
func parseArgs(s string) (map[string]string, error) {
	args := map[string]string{}
	for len(s) > 0 {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			break
		}
		key, rest, ok := strings.Cut(s, "=")
		if !ok || strings.ContainsAny(key, " \t\"") {
			return nil, fmt.Errorf("want key=value at %q", s)
		}
		var value string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				return nil, fmt.Errorf("unterminated quote at %q", s)
			}
			value, s = rest[1:1+end], rest[2+end:]
		} else {
			value, s, _ = strings.Cut(rest, " ")
		}
		if _, dup := args[key]; dup {
			return nil, fmt.Errorf("%s given twice", key)
		}
		args[key] = value
	}
	return args, nil
}

// argReader takes typed values out of an argument map and reports keys
// nobody asked for, so a typo in a transcript fails instead of being
// ignored.
type argReader struct {
	args map[string]string
	used map[string]bool
	err  error
}

func newArgReader(args map[string]string) *argReader {
	return &argReader{args: args, used: map[string]bool{}}
}

func (a *argReader) str(key, def string) string {
	a.used[key] = true
	if v, ok := a.args[key]; ok {
		return v
	}
	return def
}

func (a *argReader) uint(key string) uint64 {
	v := a.str(key, "0")
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", key, err)
	}
	return n
}

func (a *argReader) bool(key string) bool {
	v := a.str(key, "false")
	b, err := strconv.ParseBool(v)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", key, err)
	}
	return b
}

func (a *argReader) duration(key string) time.Duration {
	v := a.str(key, "0s")
	d, err := time.ParseDuration(v)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", key, err)
	}
	return d
}

func (a *argReader) time(key string) time.Time {
	v := a.str(key, "-")
	t, err := offsetTime(v)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", key, err)
	}
	return t
}

func (a *argReader) result(key string) lease.TerminalResult {
	v := a.str(key, "UNSPECIFIED")
	r, ok := parseEnum[lease.TerminalResult](v, 5)
	if !ok && a.err == nil {
		a.err = fmt.Errorf("%s: unknown result %q", key, v)
	}
	return r
}

func (a *argReader) done() error {
	if a.err != nil {
		return a.err
	}
	for k := range a.args {
		if !a.used[k] {
			return fmt.Errorf("unknown argument %q", k)
		}
	}
	return nil
}

// parseEnum finds the value of an enum type whose String is name.
func parseEnum[E interface {
	~int32
	String() string
}](name string, n int32) (E, bool) {
	for v := E(0); int32(v) < n; v++ {
		if v.String() == name {
			return v, true
		}
	}
	return 0, false
}

func buildMessage(kind string, args map[string]string) (lease.Message, error) {
	a := newArgReader(args)
	job := a.str("job", "j1")
	claim := func() lease.Claim {
		return lease.Claim{
			JobID: job, LeaseID: a.str("lease", ""), Generation: a.uint("gen"),
			HolderIdentity: a.str("holder", ""), SentAt: a.time("sent"),
		}
	}
	var m lease.Message
	switch kind {
	case "offer":
		m = lease.Offer{JobID: job, LeaseID: a.str("lease", ""), HolderIdentity: a.str("holder", ""),
			LeaseDuration: a.duration("duration"), AckTimeout: a.duration("ack_timeout"), Owner: a.str("owner", "")}
	case "ack":
		m = lease.Ack{Claim: claim()}
	case "renew":
		m = lease.Renew{Claim: claim(), RenewSequence: a.uint("seq")}
	case "progress":
		m = lease.Progress{Claim: claim(), ProgressSequence: a.uint("seq"), ProgressValue: a.str("value", "")}
	case "cancel_ack":
		m = lease.CancelAck{Claim: claim()}
	case "complete":
		m = lease.Complete{Claim: claim(), Result: a.result("result"), Detail: a.str("detail", "")}
	case "request_cancel":
		m = lease.RequestCancel{JobID: job, Generation: a.uint("gen"), Reason: a.str("reason", "")}
	case "reassign":
		m = lease.Reassign{JobID: job, Generation: a.uint("gen"), LeaseID: a.str("lease", ""), HolderIdentity: a.str("holder", ""),
			LeaseDuration: a.duration("duration"), AckTimeout: a.duration("ack_timeout"), Reason: a.str("reason", ""),
			ResolveConflict: a.bool("resolve_conflict"), Automatic: a.bool("automatic"), HolderUnavailable: a.str("holder_unavailable", "")}
	case "resolve":
		m = lease.Resolve{JobID: job, Generation: a.uint("gen"), Result: a.result("result"), UnresolvedBound: a.duration("bound"), Reason: a.str("reason", "")}
	case "tick":
		m = lease.Tick{JobID: job}
	case "recover":
		m = lease.Recover{JobID: job, LastAlive: a.time("last_alive"), ExtendTo: a.time("extend_to")}
	default:
		return nil, fmt.Errorf("unknown message %q", kind)
	}
	return m, a.done()
}

func (tr *transcript) setPolicy(rest string) error {
	args, err := parseArgs(rest)
	if err != nil {
		return err
	}
	a := newArgReader(args)
	p := &tr.policy
	durations := map[string]*time.Duration{
		"skew": &p.SkewAllowance, "default_lease": &p.DefaultLeaseDuration, "max_lease": &p.MaxLeaseDuration,
		"ack_timeout": &p.DefaultAckTimeout, "max_unresolved": &p.MaxUnresolvedBound,
		"grace": &p.RestartGrace, "spread": &p.RestartSpread,
	}
	for key, field := range durations {
		if _, ok := args[key]; ok {
			*field = a.duration(key)
		}
	}
	if _, ok := args["max_auto_reassigns"]; ok {
		p.MaxAutoReassigns = a.uint("max_auto_reassigns")
	}
	switch v := a.str("ack_miss", p.AckMiss.String()); v {
	case "expire":
		p.AckMiss = lease.AckMissExpire
	case "reassign":
		p.AckMiss = lease.AckMissReassign
	default:
		return fmt.Errorf("ack_miss %q", v)
	}
	switch v := a.str("restart", p.Restart.String()); v {
	case "extend":
		p.Restart = lease.RestartExtend
	case "strict":
		p.Restart = lease.RestartStrict
	default:
		return fmt.Errorf("restart %q", v)
	}
	if err := a.done(); err != nil {
		return err
	}
	return p.Validate()
}

// leaseField reads and writes one Lease field as transcript text.
type leaseField struct {
	get func(*lease.Lease) string
	set func(*lease.Lease, *argReader, string)
}

func timeField(f func(*lease.Lease) *time.Time) leaseField {
	return leaseField{
		get: func(l *lease.Lease) string { return formatOffset(*f(l)) },
		set: func(l *lease.Lease, a *argReader, k string) { *f(l) = a.time(k) },
	}
}

func uintField(f func(*lease.Lease) *uint64) leaseField {
	return leaseField{
		get: func(l *lease.Lease) string { return strconv.FormatUint(*f(l), 10) },
		set: func(l *lease.Lease, a *argReader, k string) { *f(l) = a.uint(k) },
	}
}

func boolField(f func(*lease.Lease) *bool) leaseField {
	return leaseField{
		get: func(l *lease.Lease) string { return strconv.FormatBool(*f(l)) },
		set: func(l *lease.Lease, a *argReader, k string) { *f(l) = a.bool(k) },
	}
}

func stringField(f func(*lease.Lease) *string) leaseField {
	return leaseField{
		get: func(l *lease.Lease) string { return *f(l) },
		set: func(l *lease.Lease, a *argReader, k string) { *f(l) = a.str(k, "") },
	}
}

func enumField[E interface {
	~int32
	String() string
}](f func(*lease.Lease) *E, n int32) leaseField {
	return leaseField{
		get: func(l *lease.Lease) string { return (*f(l)).String() },
		set: func(l *lease.Lease, a *argReader, k string) {
			v, ok := parseEnum[E](a.str(k, ""), n)
			if !ok && a.err == nil {
				a.err = fmt.Errorf("%s: unknown value %q", k, a.args[k])
			}
			*f(l) = v
		},
	}
}

var leaseFields = map[string]leaseField{
	"job":                     stringField(func(l *lease.Lease) *string { return &l.JobID }),
	"lease":                   stringField(func(l *lease.Lease) *string { return &l.LeaseID }),
	"gen":                     uintField(func(l *lease.Lease) *uint64 { return &l.Generation }),
	"holder":                  stringField(func(l *lease.Lease) *string { return &l.HolderIdentity }),
	"issued_at":               timeField(func(l *lease.Lease) *time.Time { return &l.IssuedAt }),
	"expires_at":              timeField(func(l *lease.Lease) *time.Time { return &l.ExpiresAt }),
	"ack_deadline":            timeField(func(l *lease.Lease) *time.Time { return &l.AckDeadline }),
	"ack":                     enumField(func(l *lease.Lease) *lease.AckState { return &l.AckState }, 4),
	"state":                   enumField(func(l *lease.Lease) *lease.State { return &l.State }, 6),
	"renew_seq":               uintField(func(l *lease.Lease) *uint64 { return &l.RenewSequence }),
	"renew_time":              timeField(func(l *lease.Lease) *time.Time { return &l.RenewTime }),
	"progress_seq":            uintField(func(l *lease.Lease) *uint64 { return &l.ProgressSequence }),
	"progress_value":          stringField(func(l *lease.Lease) *string { return &l.ProgressValue }),
	"cancel_requested":        boolField(func(l *lease.Lease) *bool { return &l.CancelRequested }),
	"cancel_requested_at":     timeField(func(l *lease.Lease) *time.Time { return &l.CancelRequestedAt }),
	"cancel_ack":              boolField(func(l *lease.Lease) *bool { return &l.CancelAck }),
	"cancel_acked_at":         timeField(func(l *lease.Lease) *time.Time { return &l.CancelAckedAt }),
	"terminal":                enumField(func(l *lease.Lease) *lease.TerminalResult { return &l.TerminalResult }, 5),
	"terminal_at":             timeField(func(l *lease.Lease) *time.Time { return &l.TerminalAt }),
	"terminal_detail":         stringField(func(l *lease.Lease) *string { return &l.TerminalDetail }),
	"unresolved_until":        timeField(func(l *lease.Lease) *time.Time { return &l.UnresolvedUntil }),
	"resolved_by_coordinator": boolField(func(l *lease.Lease) *bool { return &l.ResolvedByCoordinator }),
	"stale_generation":        boolField(func(l *lease.Lease) *bool { return &l.StaleGeneration }),
	"late_progress":           boolField(func(l *lease.Lease) *bool { return &l.LateProgress }),
	"lease_expired":           boolField(func(l *lease.Lease) *bool { return &l.LeaseExpired }),
	"ownership_conflict":      boolField(func(l *lease.Lease) *bool { return &l.OwnershipConflict }),
	"conflict_holder":         stringField(func(l *lease.Lease) *string { return &l.ConflictHolder }),
	"acquire_time":            timeField(func(l *lease.Lease) *time.Time { return &l.AcquireTime }),
	"last_renew_time":         timeField(func(l *lease.Lease) *time.Time { return &l.LastRenewTime }),
	"transitions":             uintField(func(l *lease.Lease) *uint64 { return &l.Transitions }),
	"auto_reassigns":          uintField(func(l *lease.Lease) *uint64 { return &l.AutoReassigns }),
	"owner":                   stringField(func(l *lease.Lease) *string { return &l.Owner }),
	"former_holders": {
		get: func(l *lease.Lease) string {
			var kept []string
			for _, h := range l.FormerHolders {
				if h != "" {
					kept = append(kept, h)
				}
			}
			return strings.Join(kept, ",")
		},
		set: func(l *lease.Lease, a *argReader, k string) {
			l.FormerHolders = [lease.MaxFormerHolders]string{}
			if v := a.str(k, ""); v != "" {
				copy(l.FormerHolders[:], strings.Split(v, ","))
			}
		},
	},
	"duration": {
		get: func(l *lease.Lease) string { return l.LeaseDuration.String() },
		set: func(l *lease.Lease, a *argReader, k string) { l.LeaseDuration = a.duration(k) },
	},
}

func (tr *transcript) load(rest string) error {
	args, err := parseArgs(rest)
	if err != nil {
		return err
	}
	a := newArgReader(args)
	l := lease.Lease{JobID: "j1"}
	for key := range args {
		f, ok := leaseFields[key]
		if !ok {
			return fmt.Errorf("unknown lease field %q", key)
		}
		f.set(&l, a, key)
	}
	if err := a.done(); err != nil {
		return err
	}
	tr.lease = l
	return nil
}

func (tr *transcript) checkState(rest string) error {
	args, err := parseArgs(rest)
	if err != nil {
		return err
	}
	var problems []string
	for key, want := range args {
		f, ok := leaseFields[key]
		if !ok {
			return fmt.Errorf("unknown lease field %q", key)
		}
		// Normalise the expectation through the same parser as load, so
		// "65s" and "1m5s" compare equal.
		var probe lease.Lease
		a := newArgReader(map[string]string{key: want})
		f.set(&probe, a, key)
		if a.err != nil {
			return a.err
		}
		if got, canon := f.get(&tr.lease), f.get(&probe); got != canon {
			problems = append(problems, fmt.Sprintf("%s=%s, want %s", key, got, want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("state: %s\n\treason: %s", strings.Join(problems, "; "), tr.decision.Reason)
	}
	return nil
}

// evidenceKey turns a header name into its transcript key: "ACK Deadline"
// becomes ack_deadline.
func evidenceKey(column string) string {
	return strings.ReplaceAll(strings.ToLower(column), " ", "_")
}

var evidenceTimeColumns = map[string]bool{
	"issued_at": true, "expires_at": true, "ack_deadline": true, "renew_time": true, "decided_at": true,
}

func (tr *transcript) checkEvidence(rest string) error {
	args, err := parseArgs(rest)
	if err != nil {
		return err
	}
	record := tr.row.Record()
	columns := map[string]string{}
	for i, name := range lease.EvidenceHeader() {
		columns[evidenceKey(name)] = record[i]
	}
	var problems []string
	for key, want := range args {
		got, ok := columns[key]
		if !ok {
			return fmt.Errorf("unknown evidence column %q", key)
		}
		if evidenceTimeColumns[key] {
			t, err := offsetTime(want)
			if err != nil {
				return err
			}
			want = ""
			if !t.IsZero() {
				want = t.Format(time.RFC3339Nano)
			}
		}
		if got != want {
			problems = append(problems, fmt.Sprintf("%s=%q, want %q", key, got, want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("evidence: %s", strings.Join(problems, "; "))
	}
	return nil
}
