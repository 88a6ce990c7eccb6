package coordinator

import (
	"fmt"
	"strconv"
)

// Store key layout. Keys are readable strings so that a person debugging a
// data directory can follow them.
//
//	leases/job/<job id>                        → the job's lease record (codec.go)
//	leases/log/<commit, hex>/<part, hex>       → a commit's evidence rows, of every job (evidencelog.go)
//	leases/evidence/<len>:<job id>/<row, hex>  → the job's rows from that row on: one (written before
//	                                             the log) or a pack of consecutive rows folded from the log
//	leases/unknown/<seq, hex>                  → rows for jobs without a lease (a bounded log)
//	leases/job/\x01evidence-log                → the layout marker (evidencelog.go): no job id
//	                                             holds a control character
//	leases/alive/<shard>                       → the shard's last decision time (restart planning)
//	leases/term                                → the current run's term (term.go: fencing)
//
// The evidence key carries the job id's length so that the rows of job "a"
// never share a prefix with those of job "a/b".
const (
	prefixJob      = "leases/job/"
	prefixEvidence = "leases/evidence/"
	prefixUnknown  = "leases/unknown/"
	prefixAlive    = "leases/alive/"
)

func jobKey(job string) []byte { return []byte(prefixJob + job) }

func evidencePrefix(job string) []byte {
	return []byte(prefixEvidence + strconv.Itoa(len(job)) + ":" + job + "/")
}

func evidenceKey(job string, row uint64) []byte {
	return fmt.Appendf(evidencePrefix(job), "%016x", row)
}

func unknownKey(seq uint64) []byte { return fmt.Appendf(nil, "%s%016x", prefixUnknown, seq) }

func aliveKey(shard int) []byte { return fmt.Appendf(nil, "%s%03d", prefixAlive, shard) }
