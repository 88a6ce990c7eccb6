package supervisor

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/internal/storecodec"
	"github.com/tetherhq/tether/supervisor/internal/kv"
)

// The stored forms of the proposals and the records: the protobuf encoding
// of their tether.v1 messages, written and read by internal/storecodec
// from the types' pb tags, so that what any version wrote reads back.

func putProposal(tx store.Txn, p *StopProposal) error {
	b, err := storecodec.Marshal(p)
	if err != nil {
		return err
	}
	if err := tx.Put(propByNodeKey(p.NodeID, p.ProposalID), nil); err != nil {
		return err
	}
	return tx.Put(proposalKey(p.ProposalID), b)
}

// getProposal reads a proposal (ErrProposalNotFound if there is none).
func getProposal(tx store.ReadTxn, proposalID string, p *StopProposal) error {
	decode := func(b []byte) error { return storecodec.Unmarshal(b, p) }
	return kv.GetOf(tx, proposalKey(proposalID), decode, ErrProposalNotFound, "proposal_id ", "proposal", proposalID)
}

func decodeProposal(b []byte, p *StopProposal) error {
	if err := storecodec.Unmarshal(b, p); err != nil {
		return fmt.Errorf("supervisor: decode proposal: %w", err)
	}
	return nil
}

// encodeRecord is a record's (or a part's) stored bytes. A record is the
// concatenation of its parts: the entries of concatenated parts append,
// as protobuf's repeated fields do.
func encodeRecord(rec *ReconciliationRecord) ([]byte, error) { return storecodec.Marshal(rec) }

func decodeRecord(b []byte, rec *ReconciliationRecord) error { return storecodec.Unmarshal(b, rec) }

// recordSize is the size of a record's encoding (what it weighs in an
// answer).
func recordSize(rec *ReconciliationRecord) (int, error) {
	b, err := storecodec.Marshal(rec)
	return len(b), err
}

// appendEntry decodes one entry of a record's stored parts (the value of
// field num, one of the entries' fields) and appends it to rec.
func appendEntry(rec *ReconciliationRecord, num protowire.Number, val []byte) error {
	switch num {
	case fieldNodes:
		return appendDecoded(&rec.Nodes, val)
	case fieldToolCalls:
		return appendDecoded(&rec.ToolCalls, val)
	case fieldPrivileges:
		return appendDecoded(&rec.Privileges, val)
	case fieldLeases:
		return appendDecoded(&rec.Leases, val)
	default:
		return fmt.Errorf("field %d is not an entry", num)
	}
}

// appendDecoded decodes one entry and appends it to entries.
func appendDecoded[E any](entries *[]E, val []byte) error {
	var e E
	if err := storecodec.Unmarshal(val, &e); err != nil {
		return err
	}
	*entries = append(*entries, e)
	return nil
}
