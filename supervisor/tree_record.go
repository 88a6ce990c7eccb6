package supervisor

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor/tree"
)

// The agent tree's and the ledger's values as the record (still a
// tether.v1 message) holds them. These go when the record has its own
// types.

// pbTime is t as the record's timestamp; the zero time is absent.
func pbTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// pbContradictions are a node's contradictions as the record lists them.
func pbContradictions(cs []tree.Contradiction) []*tetherv1.Contradiction {
	var out []*tetherv1.Contradiction
	for _, c := range cs {
		out = append(out, &tetherv1.Contradiction{Kind: c.Kind, At: pbTime(c.At), Detail: c.Detail})
	}
	return out
}
