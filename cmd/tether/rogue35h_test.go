package main

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
)

// TestRogue35HTheJSONLogWritesOutAnAgentsInvisibleCharacters: job ids are
// the offerer's choice (a parent agent offers its children jobs) and may
// hold any character but a control one. The rollout reconciler logs each
// lease it hands over with its job id ("lease handed over", job_id, at
// info: on by default) and a handover that fails with it in its error
// ("reassign job %s"). The text log quotes such a value; the JSON log
// wrote a bidirectional override, a zero-width space or a C1 control as
// it is, so an operator tailing `--log-format json` saw the rest of the
// line reversed, or two job ids read alike. The server's JSON logger now
// writes every hidden character of every string it logs (attributes,
// errors and the message) out as Go quotes it, as the text logger and the
// CLI do; the JSON stays JSON.
func TestRogue35HTheJSONLogWritesOutAnAgentsInvisibleCharacters(t *testing.T) {
	hostile := "job-1\u202e1-boj\u200b\u00a0\u009b2J"
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			var logs syncBuffer
			log, err := newLoggerTo(&logs, format, "info")
			if err != nil {
				t.Fatal(err)
			}
			// The reconciler's two lines, as it writes them.
			log.Info("lease handed over", "rollout_id", "ro_1", "job_id", hostile, "from", "n_1", "to", "n_2", "generation", 2)
			log.Warn("rollout step failed "+hostile, "rollout_id", "ro_1", "error", fmt.Errorf("reassign job %s: %w", hostile, fmt.Errorf("moved")))
			log.WithGroup("g").Info("grouped", "job", hostile)
			out := logs.String()
			if i := strings.IndexFunc(out, func(r rune) bool {
				return r != '\n' && (unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) || r == '\u00a0')
			}); i >= 0 {
				t.Fatalf("the %s log carries the rogue's hidden character %q as is:\n%q", format, []rune(out[i:])[0], out)
			}
			if format == "json" {
				for _, want := range []string{`"job_id":"job-1\\u202e1-boj\\u200b\\u00a0\\u009b2J"`, `"error":"reassign job job-1\\u202e`, `"msg":"rollout step failed job-1\\u202e`, `"g":{"job":"job-1\\u202e`, `"generation":2`} {
					if !strings.Contains(out, want) {
						t.Fatalf("the JSON log does not hold %s:\n%s", want, out)
					}
				}
			}
		})
	}
}
