package agentsdk

import (
	"crypto/sha256"
	"fmt"
)

// MaxPages bounds the answers one of the SDK's paging reads (ListSubtree,
// ReadRecord) follows next_page_token through: at the server's largest
// pages, 10 million nodes of a subtree or 30 GiB of a record, far past what
// a caller holds in memory (a caller of a larger one pages it itself, from
// the last page_token it read). A path to the control plane that answers a
// fresh token with every page (a rogue proxy or replica) is read no
// further.
const MaxPages = 10_000

// pageWalk follows the next_page_token of a paging read and ends it with
// an error where a path to the control plane would keep it reading for
// ever: the control plane's continuation always moves on (a subtree's is
// the last node the page read, a record's the entry after the page's
// last), so a token it answered before, the one asked for or any earlier
// one (a path that alternates or cycles its pages), is not the control
// plane's; nor is a read past MaxPages answers. Each token is kept as its
// SHA-256, whatever its length.
type pageWalk struct {
	what  string
	seen  map[[sha256.Size]byte]struct{}
	pages int
}

func newPageWalk(what, first string) *pageWalk {
	w := &pageWalk{what: what, seen: make(map[[sha256.Size]byte]struct{})}
	if first != "" {
		w.seen[sha256.Sum256([]byte(first))] = struct{}{}
	}
	return w
}

// next takes an answer's next_page_token (not empty): an error when it is
// one answered before or the read is past MaxPages answers.
func (w *pageWalk) next(token string) error {
	w.pages++
	sum := sha256.Sum256([]byte(token))
	if _, ok := w.seen[sum]; ok {
		return fmt.Errorf("agentsdk: %s: answer %d named a page already read as the next (the control plane's pages always move on: a path to it repeats or cycles them)", w.what, w.pages)
	}
	if w.pages >= MaxPages {
		return fmt.Errorf("agentsdk: %s: still a next page after %d answers (MaxPages); read the rest a page at a time", w.what, w.pages)
	}
	w.seen[sum] = struct{}{}
	return nil
}
