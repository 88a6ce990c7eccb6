package stoprule

import (
	"bytes"
	"fmt"
	"testing"
)

// TestShardKeysAreFmts compares the shard keys built by hand (shardKey)
// with the fmt.Appendf they replace, for every shard a key is built with
// and beyond (growShards), and tool names empty and not.
func TestShardKeysAreFmts(t *testing.T) {
	const anc = "nd_0123456789abcdefghij"
	shards := []uint32{growShards - 1, growShards, 0xfff, 0x1000, 1<<32 - 1}
	for s := range uint32(growShards) {
		shards = append(shards, s)
	}
	for _, s := range shards {
		for _, c := range []struct {
			got  []byte
			want []byte
		}{
			{growKey(anc, s), fmt.Appendf(nil, "%s%s/%02x", prefixGrow, anc, s)},
			{subKey(anc, s), fmt.Appendf(nil, "%s%s/%02x", prefixSub, anc, s)},
			{subSelfKey(anc, s), fmt.Appendf(nil, "%s%s/%02x", prefixSubSelf, anc, s)},
			{subToolKey(anc, s, "search"), fmt.Appendf(nil, "%s%s/%02x/%s", prefixSubTool, anc, s, "search")},
			{subToolKey(anc, s, ""), fmt.Appendf(nil, "%s%s/%02x/%s", prefixSubTool, anc, s, "")},
			{growKey("", s), fmt.Appendf(nil, "%s%s/%02x", prefixGrow, "", s)},
		} {
			if !bytes.Equal(c.got, c.want) {
				t.Fatalf("shard %#x: key %q, fmt wrote %q", s, c.got, c.want)
			}
		}
	}
}
