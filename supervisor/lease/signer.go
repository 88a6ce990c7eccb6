package lease

import "strings"

// SignerOf returns the principal a coordinator message's reason, or a
// Complete's detail, is signed with — "agent:n_…", "operator:…", "tool:…",
// as the control plane signs it ("<principal>: <text>") — or false when
// the reason is not signed (the control plane's own, such as a
// termination's reconciliation).
func SignerOf(reason string) (string, bool) {
	for _, kind := range []string{"agent:", "operator:", "tool:"} {
		if !strings.HasPrefix(reason, kind) {
			continue
		}
		who, _, _ := strings.Cut(reason, ": ")
		return who, who != kind
	}
	return "", false
}
