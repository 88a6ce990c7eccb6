package wire

import (
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// RecordJSONSchema derives the JSON Schema (draft 2020-12) of the
// reconciliation record as RecordJSON writes it, from the protobuf
// descriptor: one source of truth, so the published schema cannot drift
// from the code. docs/record.schema.json is this output; a test keeps them
// equal, which makes every schema change a visible diff. Changes must stay
// compatible: add fields, never rename or re-type them.
func RecordJSONSchema() ([]byte, error) {
	defs := map[string]any{}
	root := messageSchema((&tetherv1.ReconciliationRecord{}).ProtoReflect().Descriptor(), defs)
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["$id"] = fmt.Sprintf("https://tether.dev/schemas/reconciliation-record/v%d.json", supervisor.RecordSchemaVersion)
	root["title"] = "Tether reconciliation record"
	root["description"] = "Written by the control plane, outside the workload, when a termination completes: every node of the subtree exactly once (confirmed, unaccounted, or superseded by the termination that accounts for it, and naming any other termination that had it first), every tool call the termination accounted for and its resolution, every privilege and lease with its outcome, and the duration of each phase. Protobuf JSON mapping: lowerCamelCase names, enums as strings, timestamps RFC 3339, durations like \"1.5s\"; fields at their zero value are omitted."
	root["$defs"] = defs
	return json.MarshalIndent(root, "", "  ")
}

func messageSchema(md protoreflect.MessageDescriptor, defs map[string]any) map[string]any {
	props := map[string]any{}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		var s map[string]any
		switch {
		case f.IsMap():
			// protojson writes a map as an object keyed by the map's keys.
			s = map[string]any{"type": "object", "additionalProperties": fieldSchema(f.MapValue(), defs)}
		case f.IsList():
			s = map[string]any{"type": "array", "items": fieldSchema(f, defs)}
		default:
			s = fieldSchema(f, defs)
		}
		props[f.JSONName()] = s
	}
	return map[string]any{"type": "object", "properties": props, "additionalProperties": false}
}

func fieldSchema(f protoreflect.FieldDescriptor, defs map[string]any) map[string]any {
	switch f.Kind() {
	case protoreflect.StringKind:
		return map[string]any{"type": "string"}
	case protoreflect.BoolKind:
		return map[string]any{"type": "boolean"}
	case protoreflect.Int32Kind, protoreflect.Uint32Kind, protoreflect.Sint32Kind, protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		return map[string]any{"type": "integer"}
	case protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.Sint64Kind, protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		// protojson writes 64-bit integers as strings.
		return map[string]any{"type": "string", "pattern": "^-?[0-9]+$"}
	case protoreflect.EnumKind:
		ed := f.Enum()
		var names []string
		for i := 0; i < ed.Values().Len(); i++ {
			names = append(names, string(ed.Values().Get(i).Name()))
		}
		return map[string]any{"type": "string", "enum": names}
	case protoreflect.MessageKind:
		md := f.Message()
		switch md.FullName() {
		case "google.protobuf.Timestamp":
			return map[string]any{"type": "string", "format": "date-time"}
		case "google.protobuf.Duration":
			return map[string]any{"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?s$"}
		}
		name := string(md.Name())
		if _, ok := defs[name]; !ok {
			defs[name] = map[string]any{} // break cycles
			defs[name] = messageSchema(md, defs)
		}
		return map[string]any{"$ref": "#/$defs/" + name}
	}
	return map[string]any{"description": strings.ToLower(f.Kind().String())}
}
