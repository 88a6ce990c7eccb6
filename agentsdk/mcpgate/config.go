package mcpgate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Upstream is one MCP server behind the gateway: a command spoken to over
// stdio, or a Streamable HTTP URL.
type Upstream struct {
	// Name is the <upstream> of the scope "mcp:<upstream>/<tool>" and the
	// prefix of the tools in the ledger ("<upstream>/<tool>"): 1 to 32 of
	// a-z 0-9 _ -, starting with a letter or digit.
	Name string `json:"name"`
	// Command and its arguments, for a stdio upstream.
	Command []string `json:"command,omitempty"`
	// Env is added to the gateway's environment for the command; the
	// command gets none of the gateway's TETHER_ variables (its
	// credential, the agent's token), only those Env gives.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the command's working directory (default: the gateway's).
	Dir string `json:"dir,omitempty"`
	// URL of a Streamable HTTP upstream.
	URL string `json:"url,omitempty"`
	// ToolPrefix is prepended to the upstream's tool names as agents see
	// them. Default: none when the gateway has one upstream, "<name>_" when
	// it has several (so that names from two upstreams never collide).
	ToolPrefix *string `json:"tool_prefix,omitempty"`
}

// FileConfig is the gateway's configuration file (JSON):
//
//	{"upstreams": [
//	  {"name": "fs", "command": ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]},
//	  {"name": "search", "url": "http://127.0.0.1:8080/mcp"}
//	]}
type FileConfig struct {
	Upstreams []Upstream `json:"upstreams"`
}

var upstreamName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// toolName is the characters an upstream tool name may use to be grantable.
var toolName = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)

// Validate reports the first problem with u, in the words of its flags.
func (u Upstream) Validate() error {
	if !upstreamName.MatchString(u.Name) {
		return fmt.Errorf("upstream name %q: want 1-32 of a-z 0-9 _ -, starting with a letter or digit", u.Name)
	}
	switch {
	case len(u.Command) == 0 && u.URL == "":
		return fmt.Errorf("upstream %s: give a command (stdio) or a url (Streamable HTTP)", u.Name)
	case len(u.Command) > 0 && u.URL != "":
		return fmt.Errorf("upstream %s: give a command or a url, not both", u.Name)
	case u.URL != "" && !strings.HasPrefix(u.URL, "http://") && !strings.HasPrefix(u.URL, "https://"):
		return fmt.Errorf("upstream %s: url must start with http:// or https://", u.Name)
	}
	return nil
}

// LoadConfig reads a FileConfig.
func LoadConfig(path string) (FileConfig, error) {
	var fc FileConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return fc, fmt.Errorf("mcpgate: read config: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		return fc, fmt.Errorf("mcpgate: config %s: %w", path, err)
	}
	return fc, nil
}

// validateUpstreams checks a set of upstreams: each valid, names unique.
func validateUpstreams(ups []Upstream) error {
	if len(ups) == 0 {
		return errors.New("mcpgate: no upstream MCP server configured")
	}
	seen := map[string]bool{}
	for _, u := range ups {
		if err := u.Validate(); err != nil {
			return fmt.Errorf("mcpgate: %w", err)
		}
		if seen[u.Name] {
			return fmt.Errorf("mcpgate: upstream name %q is used twice", u.Name)
		}
		seen[u.Name] = true
	}
	// A tool is shown as its upstream's prefix and its name: when one
	// prefix begins another, a tool of the first upstream can take the
	// name of a tool of the second ("files_" + "archive_read" is
	// "files_archive_" + "read"), and the gateway, keeping the first
	// upstream to register a name, would send the second's callers to it.
	for i, a := range ups {
		for j, b := range ups {
			if i != j && strings.HasPrefix(toolPrefix(b, len(ups)), toolPrefix(a, len(ups))) {
				return fmt.Errorf("mcpgate: upstream %s's tool prefix %q begins upstream %s's, %q, so a tool of %s could take the name of a tool of %s: set tool_prefix so that no prefix begins another", a.Name, toolPrefix(a, len(ups)), b.Name, toolPrefix(b, len(ups)), a.Name, b.Name)
			}
		}
	}
	return nil
}

// toolPrefix is what u's tools are prefixed with, among n upstreams.
func toolPrefix(u Upstream, n int) string {
	switch {
	case u.ToolPrefix != nil:
		return *u.ToolPrefix
	case n > 1:
		return u.Name + "_"
	}
	return ""
}

// Scope is the scope a token needs to call tool on upstream.
func Scope(upstream, tool string) string { return "mcp:" + upstream + "/" + tool }
