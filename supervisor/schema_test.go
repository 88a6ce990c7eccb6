package supervisor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// TestPublishedRecordSchemaIsCurrent keeps docs/record.schema.json equal to
// the schema derived from the code. Regenerate with
// UPDATE_SCHEMA=1 go test ./supervisor -run PublishedRecordSchema.
func TestPublishedRecordSchemaIsCurrent(t *testing.T) {
	want, err := RecordJSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	path := filepath.Join("..", "docs", "record.schema.json")
	if os.Getenv("UPDATE_SCHEMA") == "1" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run UPDATE_SCHEMA=1 go test ./supervisor -run PublishedRecordSchema", path)
	}
}

// TestRecordJSONMatchesTheSchema checks a fully populated record's JSON
// against the schema's property names and types (a structural check: every
// key the record writes is declared, with the declared JSON type).
func TestRecordJSONMatchesTheSchema(t *testing.T) {
	rawSchema, err := RecordJSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(rawSchema, &schema); err != nil {
		t.Fatal(err)
	}
	now := timestamppb.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	rec := &tetherv1.ReconciliationRecord{
		RecordId: "r_1", TerminationId: "t_1", SchemaVersion: 1, NodeId: "n_1",
		Mode: tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, RequestedBy: "operator:a", Reason: "x", Escalated: true,
		Nodes:      []*tetherv1.RecordNode{{NodeId: "n_1", Name: "a", Outcome: tetherv1.NodeOutcome_NODE_OUTCOME_UNACCOUNTED, LastSeenAt: now, HeldGrantIds: []string{"g_1"}, HeldJobIds: []string{"j"}}},
		ToolCalls:  []*tetherv1.RecordToolCall{{CallId: "c_1", NodeId: "n_1", Tool: "shell", GateId: "g", Resolution: tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED}},
		Privileges: []*tetherv1.RecordPrivilege{{PrivilegeId: "v_1", Kind: "lock", ExternalId: "e", NodeId: "n_1", Outcome: tetherv1.PrivilegeOutcome_PRIVILEGE_OUTCOME_REVOKED, Error: "e"}},
		Leases:     []*tetherv1.RecordLease{{JobId: "j", LeaseId: "l", LeaseGeneration: 3, HolderIdentity: "n_1", Outcome: tetherv1.LeaseOutcome_LEASE_OUTCOME_CANCELLED}},
		Phases:     []*tetherv1.RecordPhase{{Name: "draining", StartedAt: now, Duration: durationpb.New(1500 * time.Millisecond)}},
		WrittenAt:  now,
	}
	b, err := MarshalRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	checkAgainst(t, "$", doc, schema, schema["$defs"].(map[string]any))
}

func checkAgainst(t *testing.T, path string, v any, s map[string]any, defs map[string]any) {
	t.Helper()
	if ref, ok := s["$ref"].(string); ok {
		s = defs[ref[len("#/$defs/"):]].(map[string]any)
	}
	switch s["type"] {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s: want an object, got %T", path, v)
		}
		props := s["properties"].(map[string]any)
		for k, val := range obj {
			ps, ok := props[k].(map[string]any)
			if !ok {
				t.Fatalf("%s.%s is written but not in the schema", path, k)
			}
			checkAgainst(t, path+"."+k, val, ps, defs)
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			t.Fatalf("%s: want an array, got %T", path, v)
		}
		for _, e := range arr {
			checkAgainst(t, path+"[]", e, s["items"].(map[string]any), defs)
		}
	case "string":
		if _, ok := v.(string); !ok {
			t.Fatalf("%s: want a string, got %T", path, v)
		}
	case "integer":
		if _, ok := v.(float64); !ok {
			t.Fatalf("%s: want a number, got %T", path, v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			t.Fatalf("%s: want a boolean, got %T", path, v)
		}
	}
}
