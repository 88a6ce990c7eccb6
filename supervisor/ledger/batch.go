package ledger

import (
	"github.com/tetherhq/tether/internal/store"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// Batched reads: what OpenCallsIn and GetCallIn read for one node or one
// call, for many at once, fetched together (store.Prefetch) — on etcd a
// round trip for a batch, not one per node or per call.

// OpenCallsOf lists the open calls of each node (OpenCallsIn for each),
// by node id; a node with none has no entry.
func OpenCallsOf(tx store.ReadTxn, nodeIDs []string) (map[string][]*tetherv1.ToolCall, error) {
	if err := store.Prefetch(tx, nil, kv.KeysOf(nodeIDs, openCallPrefix)); err != nil {
		return nil, err
	}
	ids := map[string][]string{}
	var all []string
	for _, node := range nodeIDs {
		if _, done := ids[node]; done {
			continue
		}
		p := openCallPrefix(node)
		var calls []string
		if err := tx.Scan(p, nil, func(k, _ []byte) error {
			calls = append(calls, string(k[len(p):]))
			return nil
		}); err != nil {
			return nil, err
		}
		ids[node] = calls
		all = append(all, calls...)
	}
	got, err := callsIn(tx, all)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]*tetherv1.ToolCall, len(all))
	for node, calls := range ids {
		for _, cid := range calls {
			out[node] = append(out[node], got[cid])
		}
	}
	return out, nil
}

// CallsIn reads the calls (GetCallIn for each), by call id.
func CallsIn(tx store.ReadTxn, callIDs []string) (map[string]*tetherv1.ToolCall, error) {
	return callsIn(tx, callIDs)
}

func callsIn(tx store.ReadTxn, callIDs []string) (map[string]*tetherv1.ToolCall, error) {
	if err := store.Prefetch(tx, kv.KeysOf(callIDs, callKey), nil); err != nil {
		return nil, err
	}
	out := make(map[string]*tetherv1.ToolCall, len(callIDs))
	for _, cid := range callIDs {
		if _, ok := out[cid]; ok {
			continue
		}
		c, err := getCall(tx, cid)
		if err != nil {
			return nil, err
		}
		out[cid] = c
	}
	return out, nil
}
