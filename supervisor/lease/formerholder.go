package lease

import "fmt"

// ForFormerHolder is what a former holder reads of the judgement of its
// message m against the job's lease l (Step's result, d its decision): its
// late traffic is judged and kept as evidence (seed §7, §11), but it may
// read nothing of the generation that replaced its own. The lease it reads
// names only the job, the current generation and its state; the decision
// keeps its outcome and event, and its reason says what happened to the
// message in words built from the message and those three alone.
//
// The reason is built rather than taken from d with the current lease id
// and holder replaced: d's reason also quotes what the former holder sent
// (the lease id it claims, a progress value), so a replacement told it
// whether a guess it put there was the current holder or lease id, and
// the reason could carry the successor's expiry (a deadline the clock
// forced as the message was judged). The evidence row keeps d whole.
func ForFormerHolder(l Lease, m Message, d Decision) (Lease, Decision) {
	seen := Lease{JobID: l.JobID, Generation: l.Generation, State: l.State}
	where := fmt.Sprintf("job %q went on as generation %d, which is %s", l.JobID, l.Generation, l.State)
	const withheld = "what the current generation holds (its lease, holder, times and reports) is withheld from an earlier generation's holder"
	if d.Event == EventStaleGeneration {
		d.Reason = fmt.Sprintf("%s is stale: %s; an older generation never regains authority, the message is kept as evidence only; %s", describe(m), where, withheld)
	} else {
		d.Reason = fmt.Sprintf("%s: %s %s; %s; %s", describe(m), d.Outcome, d.Event, where, withheld)
	}
	return seen, d
}
