package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The documents a newcomer reads: what they name must exist.
var newcomerDocs = []string{
	"README.md", "docs/*.md", "examples/README.md", "agentsdk/python/README.md",
	"agentsdk/typescript/README.md", "deploy/etcd-cluster/README.md",
}

var (
	docLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	docCodeSpan = regexp.MustCompile("`([^`\n]+)`")
	docPath     = regexp.MustCompile(`^[A-Za-z0-9_*-]+(/[A-Za-z0-9_*-]+)*/[A-Za-z0-9_*-]+\.[a-z0-9.]*[a-z0-9]$`)
	docCommand  = regexp.MustCompile(`(?:^|[\s(` + "`" + `$])tether((?: [a-z][a-z0-9-]*)+)((?: [^|;` + "`" + `]*)?)`)
	docFlag     = regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)`)
)

// TestDocsNameOnlyPathsAndCommandsThatExist reads the README and docs/ as a
// newcomer follows them: every relative link names a file; every file of the
// repository named in a code span (it starts with a top-level directory and
// its last element has an extension; "supervisor/terminate" is a benchmark's
// name) exists, from the root or beside the document; and every `tether ...`
// command in a code span or a code block names subcommands and flags the CLI
// has.
func TestDocsNameOnlyPathsAndCommandsThatExist(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	top := map[string]bool{}
	entries, err := os.ReadDir(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			top[e.Name()] = true
		}
	}
	var docs []string
	for _, pattern := range newcomerDocs {
		matches, err := filepath.Glob(filepath.Join(repo, pattern))
		if err != nil || len(matches) == 0 {
			t.Fatalf("no document matches %s (%v)", pattern, err)
		}
		docs = append(docs, matches...)
	}
	root := newRootCommand()
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repo, doc)
		inBlock := false
		for i, line := range strings.Split(string(b), "\n") {
			where := name + ":" + strconv.Itoa(i+1)
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
				continue
			}
			var code []string
			if inBlock {
				code = append(code, line)
			} else {
				for _, m := range docLink.FindAllStringSubmatch(line, -1) {
					target, _, _ := strings.Cut(m[1], "#")
					if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
						continue
					}
					if _, err := os.Stat(filepath.Join(filepath.Dir(doc), target)); err != nil {
						t.Errorf("%s: the link %s names a file that does not exist", where, m[1])
					}
				}
				for _, m := range docCodeSpan.FindAllStringSubmatch(line, -1) {
					code = append(code, m[1])
					p := m[1]
					if !docPath.MatchString(p) || !top[strings.Split(p, "/")[0]] {
						continue
					}
					inRepo, _ := filepath.Glob(filepath.Join(repo, p))
					besideDoc, _ := filepath.Glob(filepath.Join(filepath.Dir(doc), p))
					if len(inRepo)+len(besideDoc) == 0 {
						t.Errorf("%s: the path %s does not exist", where, m[1])
					}
				}
			}
			for _, c := range code {
				for _, m := range docCommand.FindAllStringSubmatch(c, -1) {
					if problem := checkDocCommand(root, strings.Fields(m[1]), m[2]); problem != "" {
						t.Errorf("%s: tether%s: %s", where, m[1], problem)
					}
				}
			}
		}
	}
}

// checkDocCommand walks words down the command tree (a word past a command
// without subcommands is an argument; "a|b" names alternatives) and checks
// the flags of rest against the command reached.
func checkDocCommand(root *cobra.Command, words []string, rest string) string {
	cmd := root
	for _, w := range words {
		if !cmd.HasAvailableSubCommands() && cmd != root {
			break
		}
		var next *cobra.Command
		for _, alt := range strings.Split(w, "|") {
			next = nil
			for _, sub := range cmd.Commands() {
				if sub.Name() == alt || sub.HasAlias(alt) {
					next = sub
				}
			}
			if next == nil {
				if cmd == root {
					return "" // prose: "tether keeps …"
				}
				return "no subcommand " + alt + " of tether " + strings.TrimPrefix(cmd.CommandPath(), "tether ")
			}
		}
		cmd = next
	}
	for _, m := range docFlag.FindAllStringSubmatch(rest, -1) {
		if m[1] != "help" && cmd.Flags().Lookup(m[1]) == nil && cmd.InheritedFlags().Lookup(m[1]) == nil {
			return "no flag --" + m[1] + " on " + cmd.CommandPath()
		}
	}
	return ""
}
