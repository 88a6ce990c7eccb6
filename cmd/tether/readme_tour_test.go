package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// tourStep is one `$ command` of the README's tour and the output the
// README shows for it.
type tourStep struct {
	command string
	want    []string
}

// readTour extracts the `$ ...` commands of the console blocks in the
// README's "A five-minute tour" section, with continuation lines, and the
// lines shown after each.
func readTour(t *testing.T) []tourStep {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "## A five-minute tour")
	if start < 0 {
		t.Fatal(`README.md has no "## A five-minute tour" section`)
	}
	text = text[start+3:]
	if end := strings.Index(text, "\n## "); end >= 0 {
		text = text[:end]
	}
	var steps []tourStep
	inConsole, continued := false, false
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```console"):
			inConsole = true
		case strings.HasPrefix(line, "```"):
			inConsole = false
		case !inConsole:
		case continued:
			steps[len(steps)-1].command += "\n" + line
			continued = strings.HasSuffix(line, `\`)
		case strings.HasPrefix(line, "$ "):
			steps = append(steps, tourStep{command: strings.TrimPrefix(line, "$ ")})
			continued = strings.HasSuffix(line, `\`)
		case len(steps) > 0:
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
		}
	}
	return steps
}

var (
	tourID     = regexp.MustCompile(`\b[a-z]_[0-9a-z]{20}\b`)
	tourSpaces = regexp.MustCompile(`\s+`)
)

// tourLine turns a line the README shows into a pattern: ids match any id
// of their kind, "…" matches anything, runs of spaces any spacing, and JSON
// may have a space after ':' and ','.
func tourLine(line string) *regexp.Regexp {
	var b strings.Builder
	rest := strings.TrimSpace(line)
	for rest != "" {
		loc := tourID.FindStringIndex(rest)
		lit := rest
		if loc != nil {
			lit = rest[:loc[0]]
		}
		for i, part := range strings.Split(lit, "…") {
			if i > 0 {
				b.WriteString(`.*`)
			}
			q := regexp.QuoteMeta(part)
			q = tourSpaces.ReplaceAllString(q, `\s+`)
			q = strings.NewReplacer(`:`, `:\s*`, `,`, `,\s*`).Replace(q)
			b.WriteString(q)
		}
		if loc == nil {
			break
		}
		b.WriteString(regexp.QuoteMeta(rest[loc[0]:loc[0]+2]) + `[0-9a-z]{20}`)
		rest = rest[loc[1]:]
	}
	return regexp.MustCompile(`^\s*` + b.String() + `\s*$`)
}

// TestReadmeTourRunsAsWritten runs the README's tour, command by command,
// in one bash session against a real `tether serve`, as a new user would
// paste it: each command must succeed (or fail where the README shows an
// error), and every line the README shows must appear in order in what it
// printed, ids and "…" aside.
func TestReadmeTourRunsAsWritten(t *testing.T) {
	if testing.Short() {
		// By design: -short (make test-short) leaves out the slow subprocess and
		// browser tests; make test and CI run them.
		t.Skip("builds and runs the binary")
	}
	// A new user has bash and curl; so must the test, rather than skip.
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("the README tour needs bash")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README tour needs curl")
	}
	steps := readTour(t)
	if len(steps) < 10 {
		t.Fatalf("found %d tour commands in README.md; the tour's console blocks moved?", len(steps))
	}

	dir := t.TempDir()
	addr := testserver.FreeAddr(t)
	testserver.StartProcessOn(t, filepath.Join(dir, "tether-data"), addr)
	bin := testserver.Binary(t)

	// One bash session, so that variables carry from command to command;
	// markers separate the commands' outputs and exit codes.
	var script strings.Builder
	script.WriteString("set +e\n")
	var run []int
	for i, s := range steps {
		switch {
		case s.command == "make run":
			continue // the test started the server
		case strings.HasPrefix(s.command, "alias tether="):
			continue // the built binary is on PATH
		}
		cmd := strings.ReplaceAll(s.command, "127.0.0.1:7420", addr)
		// curl's answers end without a newline: start the marker on its own.
		fmt.Fprintf(&script, "echo '@@begin %d'\n%s\ntour_rc=$?; echo; echo \"@@end %d $tour_rc\"\n", i, cmd, i)
		run = append(run, i)
	}
	cmd := exec.Command(bash, "--noprofile", "--norc", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + dir,
		"TETHER_ADDR=http://" + addr,
		"LANG=C.UTF-8",
	}
	out, _ := cmd.CombinedOutput()

	outputs := map[int][]string{}
	codes := map[int]string{}
	cur := -1
	for _, line := range strings.Split(string(out), "\n") {
		var i int
		var code string
		if _, err := fmt.Sscanf(line, "@@begin %d", &i); err == nil {
			cur = i
			continue
		}
		if n, _ := fmt.Sscanf(line, "@@end %d %s", &i, &code); n == 2 {
			codes[i] = code
			cur = -1
			continue
		}
		if cur >= 0 {
			outputs[cur] = append(outputs[cur], line)
		}
	}
	for _, i := range run {
		s := steps[i]
		got := outputs[i]
		wantError := len(s.want) > 0 && strings.HasPrefix(s.want[0], "error:")
		switch code, ok := codes[i]; {
		case !ok:
			t.Fatalf("$ %s\ndid not finish; the session's output:\n%s", s.command, out)
		case wantError && code == "0":
			t.Errorf("$ %s\nsucceeded; the README shows an error:\n%s", s.command, strings.Join(got, "\n"))
		case !wantError && code != "0":
			t.Errorf("$ %s\nexited %s:\n%s", s.command, code, strings.Join(got, "\n"))
		}
		next := 0
		for _, w := range s.want {
			if strings.TrimSpace(w) == "…" || strings.TrimSpace(w) == "" {
				continue
			}
			re := tourLine(w)
			for next < len(got) && !re.MatchString(got[next]) {
				next++
			}
			if next == len(got) {
				t.Errorf("$ %s\nprinted no line like the README's %q (in order); it printed:\n%s", s.command, w, strings.Join(got, "\n"))
				break
			}
			next++
		}
	}
}

func TestTourLinePatterns(t *testing.T) {
	for _, tc := range []struct {
		readme, got string
		match       bool
	}{
		{"grant_id:    g_tpddg7qas4nmj2b2s0jm", "grant_id:  g_0123456789abcdefghij", true},
		{"grant_id:    g_tpddg7qas4nmj2b2s0jm", "grant_id:  n_0123456789abcdefghij", false},
		{"token expires at …", "token expires at 2026-12-01T10:00:00Z:", true},
		{`{"code":"unauthenticated"}`, `{"code": "unauthenticated"}`, true},
		{"scopes:      tool:http", "scopes: tool:shell", false},
	} {
		if got := tourLine(tc.readme).MatchString(tc.got); got != tc.match {
			t.Errorf("README %q vs output %q: match = %v; want %v", tc.readme, tc.got, got, tc.match)
		}
	}
}
