package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the CLI in-process and returns its output and error.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// Mistakes a user makes in the first hour fail with an error that says
// what to do, before any call is made as someone else.
func TestCLIRefusesMistakesWithAnError(t *testing.T) {
	t.Setenv("TETHER_TOKEN", "")
	os.Unsetenv("TETHER_TOKEN")
	t.Setenv("TETHER_DATA_DIR", "")
	os.Unsetenv("TETHER_DATA_DIR")
	empty := t.TempDir()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown subcommand", nil, []string{"agent", "get", "n_x"}, `unknown command "get" for "tether agent"`},
		{"empty --token", nil, []string{"whoami", "--token", ""}, "--token is empty"},
		{"empty TETHER_TOKEN", map[string]string{"TETHER_TOKEN": " "}, []string{"whoami"}, "TETHER_TOKEN is set but empty"},
		{"no admin token here", nil, []string{"whoami", "--data-dir", empty}, "--data-dir"},
		{"no admin token, address without scheme", nil, []string{"whoami", "--addr", "127.0.0.1:7420", "--data-dir", empty}, "TETHER_DATA_DIR"},
		{"empty token file", nil, []string{"whoami", "--token-file", writeFile(t, "")}, "is empty"},
		{"--print of a field the command does not print", nil, []string{"token", "create", "--tool-server", "x", "--print", "credential", "--addr", "tether.example:7420"}, `--print "credential": want one of token, token_id, expires_at`},
		{"remote server without a token", nil, []string{"whoami", "--addr", "tether.example:7420"}, "no token for http://tether.example:7420"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("tether %s: err = %v; want one containing %q", strings.Join(tc.args, " "), err, tc.want)
			}
		})
	}
}

func TestCLIHelpListsTheEnvironment(t *testing.T) {
	out, err := runCLI(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"TETHER_ADDR", "TETHER_TOKEN", "TETHER_DATA_DIR", "TETHER_TLS_CA"} {
		if !strings.Contains(out, v) {
			t.Errorf("tether --help does not mention %s", v)
		}
	}
}

func TestOutputHelpListsTheCommandsFormats(t *testing.T) {
	for args, want := range map[string]string{
		"lease evidence --help": "output format: table, json or csv",
		"agent ls --help":       "output format: table, wide (every table cell whole) or json",
	} {
		out, err := runCLI(t, strings.Fields(args)...)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("tether %s: err %v; want %q in:\n%s", args, err, want, out)
		}
	}
}

func TestNormalizeAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7420":        "http://127.0.0.1:7420",
		"http://127.0.0.1:7420": "http://127.0.0.1:7420",
		"https://tether:443":    "https://tether:443",
	} {
		if got := normalizeAddr(in, false); got != want {
			t.Errorf("normalizeAddr(%q) = %q; want %q", in, got, want)
		}
	}
	if got := normalizeAddr("tether:7420", true); got != "https://tether:7420" {
		t.Errorf("with TLS flags: %q", got)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
