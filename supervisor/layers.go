package supervisor

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/internal/kv"
	"github.com/tetherhq/tether/supervisor/internal/workqueue"
	"github.com/tetherhq/tether/supervisor/ledger"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The termination reads and writes the agent tree's nodes and the ledger's
// calls inside its own transactions (it marks a subtree and its calls,
// orders cancels, and writes its record together with the state the record
// closes). These are the operations of the packages below it that it uses,
// under the short names its files use; each is only a call.

const prefixNode = tree.NodePrefix

// workQueue is the reconciler's queue (shared with the rollouts'), under
// the method names reconciler.go uses.
type workQueue struct {
	q      *workqueue.Queue
	signal <-chan struct{}
}

func newWorkQueue() *workQueue {
	q := workqueue.New()
	return &workQueue{q: q, signal: q.Signal()}
}

func (w *workQueue) add(key string)                { w.q.Add(key) }
func (w *workQueue) addAt(key string, t time.Time) { w.q.AddAt(key, t) }
func (w *workQueue) promote(now time.Time) time.Time {
	return w.q.Promote(now)
}
func (w *workQueue) take() string    { return w.q.Take() }
func (w *workQueue) done(key string) { w.q.Done(key) }
func (w *workQueue) notify()         { w.q.Notify() }

func getNode(tx store.ReadTxn, nodeID string) (*tetherv1.Node, error) {
	return tree.GetNodeIn(tx, nodeID)
}
func putNode(tx store.Txn, n *tetherv1.Node) error { return tree.PutNodeIn(tx, n) }
func nodeKey(id string) []byte                     { return tree.NodeKey(id) }
func exitConfirmed(n *tetherv1.Node) bool          { return tree.ExitConfirmed(n) }
func sessionOpen(n *tetherv1.Node) bool            { return tree.SessionOpen(n) }
func judgeExit(n *tetherv1.Node, inStopped func(nodeID string) bool, liveGrants []string) tree.ExitVerdict {
	return tree.JudgeExit(n, inStopped, liveGrants)
}

func getCall(tx store.ReadTxn, callID string) (*tetherv1.ToolCall, error) {
	return ledger.GetCallIn(tx, callID)
}
func putCall(tx store.Txn, c *tetherv1.ToolCall) error { return ledger.PutCallIn(tx, c) }
func requestCancelIn(tx store.Txn, c *tetherv1.ToolCall, terminationID string, now *timestamppb.Timestamp) error {
	return ledger.RequestCancelIn(tx, c, terminationID, now)
}
func callKey(id string) []byte             { return ledger.CallKey(id) }
func openCallPrefix(node string) []byte    { return ledger.OpenCallPrefix(node) }
func openCallKey(node, call string) []byte { return ledger.OpenCallKey(node, call) }
func cancelKey(gate, call string) []byte   { return ledger.CancelKey(gate, call) }
func termCallPrefix(term string) []byte    { return ledger.TermCallPrefix(term) }
func termCallKey(term, call string) []byte { return ledger.TermCallKey(term, call) }

func keysOf(ids []string, key func(string) []byte) [][]byte { return kv.KeysOf(ids, key) }
func putJSON(tx store.Txn, key []byte, v any) error         { return kv.PutJSON(tx, key, v) }
func putProto(tx store.Txn, key []byte, m proto.Message) error {
	return kv.PutProto(tx, key, m)
}
func getProto(tx store.ReadTxn, key []byte, m proto.Message) error {
	return kv.GetProto(tx, key, m)
}
func clip(s string) string                 { return kv.Clip(s) }
func clipUTF8(s string, n int) string      { return kv.ClipUTF8(s, n) }
func childPrefix(parent string) []byte     { return tree.ChildPrefix(parent) }
func childKey(parent, child string) []byte { return tree.ChildKey(parent, child) }
