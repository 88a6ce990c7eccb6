package agentsdk

import "fmt"

// AnswerCarries checks that a control plane's answer carries the object it
// answers for: present, and (when asked is not "") the one asked for, got.
// The control plane's answers always do, so a path to it that forged the
// answer (a proxy, a replica under a rogue's control) is told in these
// words, not read as if it held one: a nil dereference, an empty token
// printed or written, another grant shown under the id asked for. quote
// writes the ids for where the error is read (the terminal, the page).
// The console's pages and actions and the tether CLI's commands check
// their answers with it.
func AnswerCarries(kind, asked, got string, present bool, quote func(string) string) error {
	switch {
	case !present:
		return fmt.Errorf("the answer carried no %s: it is not the control plane's", kind)
	case asked != "" && got != asked:
		return fmt.Errorf("the answer carried %s %s, not %s: it is not the control plane's", kind, quote(got), quote(asked))
	}
	return nil
}
