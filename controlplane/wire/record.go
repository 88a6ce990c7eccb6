package wire

import (
	"google.golang.org/protobuf/encoding/protojson"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/supervisor"
)

// RecordJSON renders a record message as the JSON published by
// docs/record.schema.json (protobuf JSON names, lowerCamelCase, fields at
// their zero value omitted): what the record sinks deliver, the console
// shows and the demo prints.
func RecordJSON(m *tetherv1.ReconciliationRecord) ([]byte, error) {
	return protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
}

// RenderRecord is the published JSON of a record: the record outbox's
// Render (supervisor.Outbox).
func RenderRecord(r *supervisor.ReconciliationRecord) ([]byte, error) {
	return RecordJSON(Record(r))
}
