package stoprule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	"github.com/tetherhq/tether/supervisor/tree"
)

// TestOnlyStoredRulesAreKeptCompiled: the rules keep a cache of compiled
// expressions (up to 4,096 of them, 40–70 KiB each), and every expression
// compiled went into it — a TestStopRule's, which the caller chooses
// afresh every time, and an AddStopRule's that was refused — so that a
// rogue's few thousand requests had the server hold a quarter of a GiB
// of programs no rule used. Only a stored rule's expression is kept now:
// a tested expression and a refused rule's leave the cache as it was, and
// a stored rule's is kept, and reused when the rule is tested by id.
func TestOnlyStoredRulesAreKeptCompiled(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rules := &Rules{Store: st, Clock: clk}
	agents := &tree.Tree{Store: st, Clock: clk, Observer: rules, Limits: tree.DefaultLimits}
	rogueRoot, err := agents.RegisterRoot(ctx, "rogue", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	other, err := agents.RegisterRoot(ctx, "neighbour", nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	rogue := Actor{ID: "agent:" + rogueRoot.NodeID, NodeID: rogueRoot.NodeID}
	kept := func() int {
		rules.compiledMu.Lock()
		defer rules.compiledMu.Unlock()
		return len(rules.compiled)
	}

	for i := range 32 {
		if _, err := rules.Test(ctx, rogue, rogueRoot.NodeID, fmt.Sprintf("observed.age_seconds > %d.0", i), ""); err != nil {
			t.Fatalf("test %d: %v", i, err)
		}
	}
	if n := kept(); n != 0 {
		t.Fatalf("32 tested expressions left %d compiled programs in the cache, want none", n)
	}
	for i := range 8 {
		_, _, err := rules.Add(ctx, rogue, &Rule{NodeID: other.NodeID, Name: fmt.Sprintf("r%d", i), Expression: fmt.Sprintf("observed.spawns > %d", i)})
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("a rule on another tree's node: %v, want refused", err)
		}
	}
	if n := kept(); n != 0 {
		t.Fatalf("8 refused rules left %d compiled programs in the cache, want none", n)
	}
	stored, _, err := rules.Add(ctx, rogue, &Rule{NodeID: rogueRoot.NodeID, Name: "own", Expression: "observed.spawns > 100"})
	if err != nil {
		t.Fatal(err)
	}
	if n := kept(); n != 1 {
		t.Fatalf("a stored rule: %d compiled programs in the cache, want its own", n)
	}
	if _, err := rules.Test(ctx, rogue, rogueRoot.NodeID, "", stored.RuleID); err != nil {
		t.Fatal(err)
	}
	if n := kept(); n != 1 {
		t.Fatalf("the stored rule tested by id: %d compiled programs in the cache, want 1", n)
	}
}
