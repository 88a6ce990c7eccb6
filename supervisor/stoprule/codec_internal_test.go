package stoprule

import (
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/tetherhq/tether/internal/storecodec"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestStoredCountersKeepTheirBytes: the self-reported counters keep the
// bytes of the tether.v1.ReportCountersResponse the previous version
// stored, both ways.
func TestStoredCountersKeepTheirBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		counters := rapid.MapOfN(rapid.StringMatching(`[a-z_]{1,8}`), rapid.Float64(), 1, 4).Draw(t, "counters")
		raw, err := storecodec.Marshal(&reported{Counters: counters})
		if err != nil {
			t.Fatal(err)
		}
		var m tetherv1.ReportCountersResponse
		if err := proto.Unmarshal(raw, &m); err != nil || !maps.Equal(m.Counters, counters) {
			t.Fatalf("stored counters decode as %v (%v), want %v", m.Counters, err, counters)
		}
		old, err := proto.Marshal(&tetherv1.ReportCountersResponse{Counters: counters})
		if err != nil {
			t.Fatal(err)
		}
		var back reported
		if err := storecodec.Unmarshal(old, &back); err != nil || !maps.Equal(back.Counters, counters) {
			t.Fatalf("counters the previous version stored read as %v (%v), want %v", back.Counters, err, counters)
		}
	})
}
