package ledger

import "github.com/tetherhq/tether/internal/storecodec"

// A call's stored form is tether.v1.ToolCall's protobuf encoding, written
// from ToolCall's pb tags.

func encodeCall(c *ToolCall) ([]byte, error) { return storecodec.Marshal(c) }

// UnmarshalCall decodes a call from its stored form.
func UnmarshalCall(b []byte, c *ToolCall) error { return storecodec.Unmarshal(b, c) }
