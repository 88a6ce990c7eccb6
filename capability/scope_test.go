package capability_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/tetherhq/tether/capability"
)

func TestValidateScope(t *testing.T) {
	valid := []string{
		"tool:shell",
		"tool:*",
		"*",
		"a",
		"a*",
		"s3:read:bucket/prefix*",
		"s3:read:bucket/dir/file.txt",
		"net:connect:10.0.0.1:443",
		strings.Repeat("x", capability.MaxScopeBytes),
		strings.Repeat("x", capability.MaxScopeBytes-1) + "*",
	}
	for _, s := range valid {
		if err := capability.ValidateScope(s); err != nil {
			t.Errorf("ValidateScope(%q) = %v, want nil", s, err)
		}
	}
	invalid := map[string]string{
		"empty":               "",
		"too long":            strings.Repeat("x", capability.MaxScopeBytes+1),
		"space":               "tool: shell",
		"tab":                 "tool:\tshell",
		"newline":             "tool:shell\n",
		"non-ASCII":           "tool:shéll",
		"NUL":                 "tool:\x00",
		"DEL":                 "tool:\x7f",
		"inner wildcard":      "tool:*:read",
		"leading wildcard":    "*tool",
		"double wildcard":     "tool:**",
		"leading colon":       ":tool",
		"trailing colon":      "tool:",
		"empty segment":       "tool::shell",
		"only colon":          ":",
		"wildcard then colon": "tool*:",
	}
	for name, s := range invalid {
		err := capability.ValidateScope(s)
		if !errors.Is(err, capability.ErrInvalidScope) {
			t.Errorf("%s: ValidateScope(%q) = %v, want ErrInvalidScope", name, s, err)
		}
	}
}

func TestValidateScopeErrorDoesNotEchoControlBytes(t *testing.T) {
	err := capability.ValidateScope("tool:\x1b[31mred")
	if err == nil || strings.ContainsRune(err.Error(), 0x1b) {
		t.Fatalf("error %q must exist and must not contain the raw escape byte", err)
	}
}

func TestCovers(t *testing.T) {
	tests := []struct {
		parent, child string
		want          bool
	}{
		{"tool:shell", "tool:shell", true},
		{"tool:shell", "tool:shells", false},
		{"tool:shell", "tool:*", false},
		{"tool:*", "tool:shell", true},
		{"tool:*", "tool:shell:exec", true}, // the wildcard spans segments
		{"tool:*", "tool:sh*", true},
		{"tool:*", "tool:*", true},
		{"tool:*", "tool", false},
		{"tool:*", "toolbox:x", false},
		{"tool*", "toolbox:x", true}, // a wildcard is a raw prefix, not a segment boundary
		{"tool:sh*", "tool:*", false},
		{"tool:sh*", "tool:shell", true},
		{"*", "anything:at:all", true},
		{"*", "*", true},
		{"tool:shell", "*", false},
		{"s3:read:bucket/prefix*", "s3:read:bucket/prefix/a.txt", true},
		{"s3:read:bucket/prefix*", "s3:read:bucket/other", false},
		{"s3:read:bucket/prefix*", "s3:write:bucket/prefix/a.txt", false},
		{"a*", "a", true}, // the suffix may be empty
		// invalid scopes are covered by nothing and cover nothing
		{"tool:*", "tool:sh ell", false},
		{"tool:*:x", "tool:a:x", false},
		{"", "", false},
		{"*", "", false},
	}
	for _, tt := range tests {
		if got := capability.Covers(tt.parent, tt.child); got != tt.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tt.parent, tt.child, got, tt.want)
		}
	}
}

func TestSubset(t *testing.T) {
	tests := []struct {
		name          string
		parent, child []string
		offending     string
		ok            bool
	}{
		{"equal", []string{"tool:shell"}, []string{"tool:shell"}, "", true},
		{"narrower", []string{"tool:*", "s3:read:*"}, []string{"tool:shell", "s3:read:b/x"}, "", true},
		{"empty child", []string{"tool:*"}, nil, "", true},
		{"escalation named", []string{"tool:shell"}, []string{"tool:shell", "tool:net", "tool:fs"}, "tool:net", false},
		{"wildcard child over concrete parent", []string{"tool:shell"}, []string{"tool:*"}, "tool:*", false},
		{"no parent scopes", nil, []string{"tool:shell"}, "tool:shell", false},
		{"invalid child", []string{"*"}, []string{"bad scope"}, "bad scope", false},
		{
			// union of patterns never stands in for a broader one
			"union is not enough",
			[]string{"tool:a*", "tool:b*"}, []string{"tool:*"}, "tool:*", false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			offending, ok := capability.Subset(tt.parent, tt.child)
			if ok != tt.ok || offending != tt.offending {
				t.Fatalf("Subset = (%q, %v), want (%q, %v)", offending, ok, tt.offending, tt.ok)
			}
		})
	}
}

func TestAllows(t *testing.T) {
	granted := []string{"tool:shell", "s3:read:logs/*", "not a scope"}
	tests := []struct {
		required string
		want     bool
	}{
		{"tool:shell", true},
		{"tool:net", false},
		{"s3:read:logs/2026/01.gz", true},
		{"s3:read:logs/*", true},
		{"s3:read:*", false},
		{"s3:write:logs/x", false},
		{"not a scope", false}, // an invalid granted entry grants nothing
		{"", false},
	}
	for _, tt := range tests {
		if got := capability.Allows(granted, tt.required); got != tt.want {
			t.Errorf("Allows(%q) = %v, want %v", tt.required, got, tt.want)
		}
	}
}

// scopeGen draws valid scopes from a small alphabet so that prefixes,
// wildcards and collisions are frequent.
func scopeGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		segments := rapid.SliceOfN(rapid.StringMatching(`[ab/.]{1,3}`), 1, 3).Draw(t, "segments")
		s := strings.Join(segments, ":")
		switch rapid.IntRange(0, 2).Draw(t, "wildcard") {
		case 1:
			s += "*"
		case 2:
			// cut mid-segment before the wildcard, as in "s3:read:pre*"
			cut := rapid.IntRange(1, len(s)).Draw(t, "cut")
			if s[cut-1] != ':' {
				s = s[:cut] + "*"
			}
		}
		return s
	})
}

func concreteGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		segments := rapid.SliceOfN(rapid.StringMatching(`[ab/.]{1,4}`), 1, 4).Draw(t, "segments")
		return strings.Join(segments, ":")
	})
}

// naiveMatch is the matching rule written independently, as a regular
// expression: a trailing '*' is ".*", everything else is literal.
func naiveMatch(pattern, concrete string) bool {
	expr := regexp.QuoteMeta(pattern)
	if strings.HasSuffix(pattern, "*") {
		expr = regexp.QuoteMeta(pattern[:len(pattern)-1]) + ".*"
	}
	return regexp.MustCompile("^" + expr + "$").MatchString(concrete)
}

func TestCoversIsPreorderConsistentWithMatching(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := scopeGen().Draw(t, "a")
		b := scopeGen().Draw(t, "b")
		c := scopeGen().Draw(t, "c")
		x := concreteGen().Draw(t, "x")
		for _, s := range []string{a, b, c, x} {
			if err := capability.ValidateScope(s); err != nil {
				t.Fatalf("generator produced invalid scope %q: %v", s, err)
			}
		}
		if !capability.Covers(a, a) {
			t.Fatalf("Covers(%q, itself) is false", a)
		}
		if capability.Covers(a, b) && capability.Covers(b, c) && !capability.Covers(a, c) {
			t.Fatalf("not transitive: %q ⊇ %q ⊇ %q but not %q ⊇ %q", a, b, c, a, c)
		}
		// For a concrete child, covering is matching.
		if got, want := capability.Covers(a, x), naiveMatch(a, x); got != want {
			t.Fatalf("Covers(%q, %q) = %v, regexp match = %v", a, x, got, want)
		}
		// Soundness: whatever b matches, a matches when a covers b.
		if capability.Covers(a, b) && naiveMatch(b, x) && !naiveMatch(a, x) {
			t.Fatalf("%q covers %q, which matches %q, but %q does not", a, b, x, a)
		}
		// Completeness: if a does not cover b, a witness matched by b and not by a exists.
		if !capability.Covers(a, b) {
			witness := strings.TrimSuffix(b, "*")
			if strings.HasSuffix(b, "*") && (witness == "" || strings.HasSuffix(witness, ":")) {
				witness += "z" // the empty suffix would not be a valid scope
			} else if strings.HasSuffix(b, "*") && strings.HasPrefix(a, witness) {
				witness += "z"
			}
			if capability.ValidateScope(witness) != nil || !naiveMatch(b, witness) || naiveMatch(a, witness) {
				t.Fatalf("%q does not cover %q, but witness %q does not show it", a, b, witness)
			}
		}
	})
}

// The MCP gateway's scopes, mcp:<upstream>/<tool>, are ordinary scopes: the
// slash is a printable byte like any other and the one wildcard rule
// applies. A pattern that ends at the slash stays within one upstream; one
// that does not also reaches upstreams whose names extend it.
func TestMCPScopesFollowTheOneWildcardRule(t *testing.T) {
	tests := []struct {
		parent, child string
		want          bool
	}{
		{"mcp:*", "mcp:fs/read_file", true},
		{"mcp:fs/*", "mcp:fs/read_file", true},
		{"mcp:fs/*", "mcp:fs/nested/tool", true},
		{"mcp:fs/*", "mcp:fs2/read_file", false},
		{"mcp:fs*", "mcp:fs2/read_file", true}, // no slash: a raw prefix
		{"mcp:fs/read_*", "mcp:fs/read_text_file", true},
		{"mcp:fs/read_*", "mcp:fs/write_file", false},
		{"mcp:fs/read_file", "mcp:fs/read_file", true},
		{"mcp:fs/read_file", "mcp:fs/read_file_2", false},
		{"tool:*", "mcp:fs/read_file", false},
		{"mcp:fs/read_file", "mcp:fs/*", false},
	}
	for _, tt := range tests {
		if got := capability.Covers(tt.parent, tt.child); got != tt.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", tt.parent, tt.child, got, tt.want)
		}
	}
	for _, s := range []string{"mcp:fs/read_file", "mcp:fs/*", "mcp:my-server/tool.v2"} {
		if err := capability.ValidateScope(s); err != nil {
			t.Errorf("ValidateScope(%q) = %v", s, err)
		}
	}
}

// A space is the mistake users make ("tool:a tool:b" as one scope): the
// error says so in those words, not as a non-printable byte.
func TestValidateScopeNamesASpace(t *testing.T) {
	err := capability.ValidateScope("tool:http tool:shell")
	if err == nil || !strings.Contains(err.Error(), "has a space at offset 9") || strings.Contains(err.Error(), "printable") {
		t.Fatalf("ValidateScope with a space = %v; want it to name the space", err)
	}
}
