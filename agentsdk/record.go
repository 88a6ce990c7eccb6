package agentsdk

import (
	"context"
	"errors"
	"fmt"

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
// (0: every one, up to MaxPages): more reports that the record has entries
// past those it read, which the record returned then lacks. A record a
// page shows is its stopped subtree, which a rogue may grow to a hundred
// thousand nodes; a reader that only shows a part reads a part.
//
// An answer the control plane never gives is an error, never a panic nor
// a read without end: an answer without a record, a first page of another
// record or termination than req names, a following page without an
// entry (the control plane's always carry one), and a next_page_token it
// answered before (a path to it, a rogue proxy or replica, that repeats or
// cycles its pages).
func ReadRecordPages(ctx context.Context, c tetherv1connect.SupervisorServiceClient, req *tetherv1.GetRecordRequest, answers int) (rec *tetherv1.ReconciliationRecord, more bool, err error) {
	resp, err := c.GetRecord(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, false, err
	}
	rec = resp.Msg.GetRecord()
	if rec == nil {
		return nil, false, errors.New("agentsdk: GetRecord answered no record")
	}
	if req.PageToken == "" && (req.RecordId != "" && rec.RecordId != req.RecordId || req.TerminationId != "" && rec.TerminationId != req.TerminationId) {
		return nil, false, fmt.Errorf("agentsdk: GetRecord answered the record of another stop than the one asked for (record %s, termination %s)", clipped(rec.RecordId), clipped(rec.TerminationId))
	}
	next := resp.Msg.NextPageToken
	walk := newPageWalk("GetRecord", req.PageToken)
	for read := 1; next != "" && (answers <= 0 || read < answers); read++ {
		if err := walk.next(next); err != nil {
			return nil, false, err
		}
		page, err := c.GetRecord(ctx, connect.NewRequest(&tetherv1.GetRecordRequest{RecordId: rec.RecordId, PageSize: req.PageSize, PageToken: next}))
		if err != nil {
			return nil, false, err
		}
		p := page.Msg.GetRecord()
		if p == nil || len(p.Nodes)+len(p.ToolCalls)+len(p.Privileges)+len(p.Leases) == 0 {
			return nil, false, fmt.Errorf("agentsdk: GetRecord answered page %d of the record without an entry", read+1)
		}
		rec.Nodes = append(rec.Nodes, p.Nodes...)
		rec.ToolCalls = append(rec.ToolCalls, p.ToolCalls...)
		rec.Privileges = append(rec.Privileges, p.Privileges...)
		rec.Leases = append(rec.Leases, p.Leases...)
		next = page.Msg.NextPageToken
	}
	return rec, next != "", nil
}

// RanOnAfterCancel reports whether a record's tool call was reported ended
// by its gate (completed or failed) after the termination ordered its
// cancel, instead of acknowledging the cancel: the tool was not stopped by
// the order and did what it did after it. The console's record page lists
// such calls under Needs attention and `tether record show` prints them
// "completed after its cancel"; before the forty-third and forty-fourth
// passes both read them "completed", like a call that ended before the stop
// (a rogue tool server that let its tool run on through the abort had the
// record say nothing needed attention).
func RanOnAfterCancel(c *tetherv1.RecordToolCall) bool {
	return c.GetCancelRequestedAt() != nil && (c.GetResolution() == tetherv1.CallResolution_CALL_RESOLUTION_COMPLETED || c.GetResolution() == tetherv1.CallResolution_CALL_RESOLUTION_FAILED)
}
