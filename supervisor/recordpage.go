package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tetherhq/tether/internal/id"
	"github.com/tetherhq/tether/internal/store"
	"github.com/tetherhq/tether/supervisor/tree"
)

// RecordPageBytes bounds the entries of one page of a record (GetRecord),
// so that an answer, header included, stays under gRPC clients' default
// 4 MiB receive limit. A variable so tests can page a small record
// without a page size.
var RecordPageBytes = 3 << 20

// MaxRecordPageSize caps a page's entries however large page_size is.
const MaxRecordPageSize = 100_000

// The record's repeated entries: what a page carries a slice of. Every
// other field is the header's.
const (
	fieldNodes      protowire.Number = 9
	fieldToolCalls  protowire.Number = 10
	fieldPrivileges protowire.Number = 11
	fieldLeases     protowire.Number = 12
)

// recordCursor is where a page starts in a record's stored bytes: a part
// and an offset in it, always at the start of an entry.
type recordCursor struct {
	RecordID string
	Part     int
	Offset   int
	// Sum binds the cursor to the record and to the bytes of the entry it
	// points at, so an altered token is found out before it is read from.
	Sum string
}

func cursorSum(recordID string, part, off int, entry []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00", recordID, part, off)
	h.Write(entry)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

func (c recordCursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("r1|%s|%d|%d|%s", c.RecordID, c.Part, c.Offset, c.Sum)))
}

var errBadRecordToken = fmt.Errorf("%w: page_token is not a token from an earlier GetRecord answer", tree.ErrInvalidArgument)

func parseRecordToken(token string) (recordCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(token) > 512 {
		return recordCursor{}, errBadRecordToken
	}
	f := strings.Split(string(b), "|")
	if len(f) != 5 || f[0] != "r1" || id.Check(id.Record, "record_id", f[1]) != nil {
		return recordCursor{}, errBadRecordToken
	}
	part, err1 := strconv.Atoi(f[2])
	off, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		return recordCursor{}, errBadRecordToken
	}
	return recordCursor{RecordID: f[1], Part: part, Offset: off, Sum: f[4]}, nil
}

// RecordPage returns one page of a record (by its id, its termination's
// id, or a page token from an earlier page) and the token of the next
// page, "" after the last. pageSize caps the page's entries (0: as many as
// RecordPageBytes holds). The first page is the record's header with the
// first entries; the following ones carry entries only. Only the stored
// parts a page needs are read. A small record reads whole in one page,
// exactly as Record returns it.
func (s *Supervisor) RecordPage(ctx context.Context, recordID, terminationID, pageToken string, pageSize int) (*ReconciliationRecord, string, error) {
	if pageSize < 0 {
		return nil, "", fmt.Errorf("%w: page_size must not be negative", tree.ErrInvalidArgument)
	}
	if pageSize == 0 || pageSize > MaxRecordPageSize {
		pageSize = MaxRecordPageSize
	}
	var from *recordCursor
	if pageToken != "" {
		c, err := parseRecordToken(pageToken)
		if err != nil {
			return nil, "", err
		}
		from = &c
	}
	if err := checkRecordRef(recordID, terminationID, from == nil); err != nil {
		return nil, "", err
	}
	var rec *ReconciliationRecord
	var next string
	err := s.Store.View(ctx, func(tx store.ReadTxn) error {
		rec, next = nil, ""
		rid, err := recordIDIn(tx, recordID, terminationID)
		if err != nil {
			return err
		}
		if from != nil {
			if rid != "" && rid != from.RecordID {
				return fmt.Errorf("%w: page_token is for record %s, not %s", tree.ErrInvalidArgument, from.RecordID, rid)
			}
			rid = from.RecordID
		}
		rec, next, err = recordPage(tx, rid, from, pageSize, RecordPageBytes)
		return err
	})
	return rec, next, err
}

// recordPage reads a page of a record in tx: from the first entry (with
// the header) or from a cursor (entries only).
func recordPage(tx store.ReadTxn, recordID string, from *recordCursor, maxEntries, maxBytes int) (*ReconciliationRecord, string, error) {
	v, err := tx.Get(recordKey(recordID))
	if errors.Is(err, store.ErrNotFound) {
		if from != nil {
			return nil, "", errBadRecordToken
		}
		return nil, "", fmt.Errorf("%w: record_id %s", ErrRecordNotFound, recordID)
	}
	if err != nil {
		return nil, "", err
	}
	parts, head, err := parseRecordHeader(recordID, v)
	if err != nil {
		return nil, "", err
	}
	rec := &ReconciliationRecord{}
	start := recordCursor{RecordID: recordID}
	if from == nil {
		// The header: its own parts, or (a record stored before they were
		// kept apart) the whole record without its entries.
		var b []byte
		first := head
		if head == parts {
			first = 0
		}
		for i := first; i < parts; i++ {
			p, err := tx.Get(recordPartKey(recordID, i))
			if err != nil {
				return nil, "", fmt.Errorf("supervisor: record %s part %d: %w", recordID, i, err)
			}
			b = append(b, p...)
		}
		if err := decodeRecord(b, rec); err != nil {
			return nil, "", fmt.Errorf("supervisor: decode record %s: %w", recordID, err)
		}
		rec.Nodes, rec.ToolCalls, rec.Privileges, rec.Leases = nil, nil, nil, nil
		size, err := recordSize(rec)
		if err != nil {
			return nil, "", err
		}
		maxBytes -= size
	} else {
		if from.Part >= head {
			return nil, "", errBadRecordToken
		}
		start = *from
	}
	r := partReader{tx: tx, recordID: recordID, next: start.Part, end: head}
	if err := r.load(); errors.Is(err, errEndOfEntries) {
		return rec, "", nil // a record without entries
	} else if err != nil {
		return nil, "", err
	}
	if start.Offset > len(r.buf) {
		return nil, "", errBadRecordToken
	}
	r.pos = start.Offset
	entries, size := 0, 0
	for first := true; ; first = false {
		at := r.cursor()
		num, raw, err := r.field()
		if errors.Is(err, errEndOfEntries) {
			if first && from != nil {
				return nil, "", errBadRecordToken
			}
			return rec, "", nil
		}
		if err != nil {
			if first && from != nil {
				return nil, "", errBadRecordToken
			}
			return nil, "", fmt.Errorf("supervisor: decode record %s: %w", recordID, err)
		}
		if first && from != nil && cursorSum(recordID, at.Part, at.Offset, raw) != from.Sum {
			return nil, "", errBadRecordToken
		}
		switch num {
		case fieldNodes, fieldToolCalls, fieldPrivileges, fieldLeases:
		default:
			if first && from != nil {
				return nil, "", errBadRecordToken
			}
			continue // a header field of an older record: the first page has it
		}
		if entries > 0 && (entries == maxEntries || size+len(raw) > maxBytes) {
			at.Sum = cursorSum(recordID, at.Part, at.Offset, raw)
			return rec, at.token(), nil
		}
		_, _, n := protowire.ConsumeTag(raw)
		val, m2 := protowire.ConsumeBytes(raw[n:])
		if m2 < 0 {
			return nil, "", fmt.Errorf("supervisor: decode record %s: entry of field %d is not a message", recordID, num)
		}
		if err := appendEntry(rec, num, val); err != nil {
			if first && from != nil {
				return nil, "", errBadRecordToken
			}
			return nil, "", fmt.Errorf("supervisor: decode record %s: %w", recordID, err)
		}
		entries++
		size += len(raw)
	}
}

var errEndOfEntries = errors.New("end of the record's entries")

// partReader reads a record's stored parts in order, as one stream of
// protobuf fields: a field may span parts (a chunk's part is split under
// the store's value limit), so a part is read when a field needs it.
type partReader struct {
	tx       store.ReadTxn
	recordID string
	next     int // the next part to read
	end      int // the first part not to read (the header's)
	buf      []byte
	starts   []int // where each read part starts in buf
	first    int   // the number of the part at starts[0]
	pos      int
}

func (r *partReader) load() error {
	if r.next >= r.end {
		return errEndOfEntries
	}
	p, err := r.tx.Get(recordPartKey(r.recordID, r.next))
	if err != nil {
		return fmt.Errorf("supervisor: record %s part %d: %w", r.recordID, r.next, err)
	}
	if len(r.starts) == 0 {
		r.first = r.next
	}
	r.starts = append(r.starts, len(r.buf))
	r.buf = append(r.buf, p...)
	r.next++
	return nil
}

// cursor is the position of the next field, as a part and an offset.
func (r *partReader) cursor() recordCursor {
	i := len(r.starts) - 1
	for i > 0 && r.starts[i] > r.pos {
		i--
	}
	return recordCursor{RecordID: r.recordID, Part: r.first + i, Offset: r.pos - r.starts[i]}
}

// field returns the next field (tag and value) whole.
func (r *partReader) field() (protowire.Number, []byte, error) {
	for {
		if r.pos == len(r.buf) {
			if err := r.load(); err != nil {
				return 0, nil, err
			}
			continue
		}
		rest := r.buf[r.pos:]
		num, typ, n := protowire.ConsumeTag(rest)
		if n >= 0 {
			if m := protowire.ConsumeFieldValue(num, typ, rest[n:]); m >= 0 {
				raw := rest[:n+m]
				r.pos += n + m
				return num, raw, nil
			}
		}
		if err := r.load(); errors.Is(err, errEndOfEntries) {
			return 0, nil, errors.New("a field is cut short at the end of the entries")
		} else if err != nil {
			return 0, nil, err
		}
	}
}
