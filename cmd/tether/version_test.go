package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestPrintVersionShowsBuildInfo(t *testing.T) {
	var out bytes.Buffer
	printVersion(&out, &debug.BuildInfo{
		GoVersion: "go1.25.0",
		Main:      debug.Module{Path: "github.com/tetherhq/tether", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "5b544fa0"},
			{Key: "vcs.modified", Value: "true"},
			{Key: "vcs.time", Value: "2026-12-01T14:00:00Z"},
		},
	})
	for _, want := range []string{"tether v0.3.0", "5b544fa0 (modified)", "2026-12-01T14:00:00Z", "go1.25.0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, out.String())
		}
	}
}
