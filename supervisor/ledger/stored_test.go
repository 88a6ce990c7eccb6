package ledger_test

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/controlplane/wire"
	"github.com/tetherhq/tether/internal/populated"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/store/badgerstore"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/ledger"
)

// fullCall has every field set, so that the compatibility test covers each.
func fullCall() *ledger.ToolCall {
	at := func(s int) time.Time { return time.Date(2026, 3, 1, 12, 0, s, 123456789, time.UTC) }
	return &ledger.ToolCall{
		CallID: "c_1", NodeID: "n_1", GrantID: "g_1", Tool: "shell", GateID: "gate-1",
		State: ledger.CallStateEnded, Resolution: ledger.CallResolutionCancelledAcked,
		BegunAt: at(1), EndedAt: at(4), CancelRequestedAt: at(2), CancelAckedAt: at(3),
		TerminationID: "t_1", Error: "interrupted",
		BegunBy: "tool:shell-gate", EndedBy: "tool:shell-gate", AcknowledgedBy: "tool:shell-gate",
	}
}

// TestStoredCallsKeepTheTetherV1Encoding: a call this version stores reads,
// as a tether.v1.ToolCall, exactly as the RPC edge shows it (so the
// previous version, which stored and read the message itself, reads it),
// and a call the previous version stored reads back as the same call.
func TestStoredCallsKeepTheTetherV1Encoding(t *testing.T) {
	st, err := badgerstore.OpenBadger(t.TempDir(), badgerstore.BadgerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	c := fullCall()
	if unset := populated.Unset(c); len(unset) > 0 {
		t.Fatalf("the test call leaves %v unset: set them, or the test does not cover them", unset)
	}

	var stored []byte
	err = st.Update(ctx, func(tx store.Txn) error {
		if err := ledger.PutCallIn(tx, c); err != nil {
			return err
		}
		stored, err = tx.Get(ledger.CallKey(c.CallID))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var m tetherv1.ToolCall
	if err := proto.Unmarshal(stored, &m); err != nil {
		t.Fatalf("the stored call is not a tether.v1.ToolCall: %v", err)
	}
	if want := wire.ToolCall(c); !proto.Equal(&m, want) {
		t.Fatalf("the stored call reads as\n%v\nwant (as the edge shows it)\n%v", &m, want)
	}

	old := wire.ToolCall(c)
	old.CallId = "c_older"
	b, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	var got *ledger.ToolCall
	err = st.Update(ctx, func(tx store.Txn) error {
		if err := tx.Put(ledger.CallKey(old.CallId), b); err != nil {
			return err
		}
		got, err = ledger.GetCallIn(tx, old.CallId)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fullCall()
	want.CallID = "c_older"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("a call the previous version stored reads as\n%+v\nwant\n%+v", got, want)
	}
}
