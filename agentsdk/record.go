package agentsdk

import (
	"context"

	"connectrpc.com/connect"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// ReadRecord reads a reconciliation record whole (by req's record_id or
// termination_id), following GetRecord's pages: a record too large for
// one message arrives in several answers, and the record returned is the
// first answer's header with every page's nodes, tool calls, privileges
// and leases appended in order, as one GetRecord answers a small record.
func ReadRecord(ctx context.Context, c tetherv1connect.SupervisorServiceClient, req *tetherv1.GetRecordRequest) (*tetherv1.ReconciliationRecord, error) {
	resp, err := c.GetRecord(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	rec := resp.Msg.Record
	for next := resp.Msg.NextPageToken; next != ""; {
		page, err := c.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: rec.RecordId, PageSize: req.PageSize, PageToken: next}))
		if err != nil {
			return nil, err
		}
		p := page.Msg.Record
		rec.Nodes = append(rec.Nodes, p.Nodes...)
		rec.ToolCalls = append(rec.ToolCalls, p.ToolCalls...)
		rec.Privileges = append(rec.Privileges, p.Privileges...)
		rec.Leases = append(rec.Leases, p.Leases...)
		next = page.Msg.NextPageToken
	}
	return rec, nil
}
