package wire

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestPublishedRecordSchemaIsCurrent keeps docs/record.schema.json equal to
// the schema derived from the code. Regenerate with
// UPDATE_SCHEMA=1 go test ./controlplane/wire -run PublishedRecordSchema.
func TestPublishedRecordSchemaIsCurrent(t *testing.T) {
	want, err := RecordJSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	path := filepath.Join("..", "..", "docs", "record.schema.json")
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
		t.Fatalf("%s is stale: run UPDATE_SCHEMA=1 go test ./controlplane/wire -run PublishedRecordSchema", path)
	}
}

// TestRecordJSONMatchesTheSchema checks a fully populated record's JSON,
// as the sinks publish it, against the schema's property names and types (a structural check: every
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
	b, err := RenderRecord(record())
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
		props, _ := s["properties"].(map[string]any)
		for k, val := range obj {
			ps, ok := props[k].(map[string]any)
			if extra, isMap := s["additionalProperties"].(map[string]any); isMap && props == nil {
				ps, ok = extra, true // a map: any key, values of one schema
			}
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
