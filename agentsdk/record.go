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
	rec, _, err := ReadRecordPages(ctx, c, req, 0)
	return rec, err
}

// ReadRecordPages is ReadRecord reading at most answers GetRecord answers
// (0: every one): more reports that the record has entries past those it
// read, which the record returned then lacks. A record a page shows is
// its stopped subtree, which a rogue may grow to a hundred thousand nodes;
// a reader that only shows a part reads a part.
func ReadRecordPages(ctx context.Context, c tetherv1connect.SupervisorServiceClient, req *tetherv1.GetRecordRequest, answers int) (rec *tetherv1.ReconciliationRecord, more bool, err error) {
	resp, err := c.GetRecord(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, false, err
	}
	rec = resp.Msg.Record
	next := resp.Msg.NextPageToken
	for read := 1; next != "" && (answers <= 0 || read < answers); read++ {
		page, err := c.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: rec.RecordId, PageSize: req.PageSize, PageToken: next}))
		if err != nil {
			return nil, false, err
		}
		p := page.Msg.Record
		rec.Nodes = append(rec.Nodes, p.Nodes...)
		rec.ToolCalls = append(rec.ToolCalls, p.ToolCalls...)
		rec.Privileges = append(rec.Privileges, p.Privileges...)
		rec.Leases = append(rec.Leases, p.Leases...)
		next = page.Msg.NextPageToken
	}
	return rec, next != "", nil
}
