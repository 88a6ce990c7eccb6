package printable

import "testing"

func TestStringWritesOutWhatWouldNotShow(t *testing.T) {
	for _, tc := range []struct{ in, keep, want string }{
		{"job-1", "", "job-1"},
		{"plain words, a tab\tand a line\n", "\n\t", "plain words, a tab\tand a line\n"},
		{"a line\nforged", "", `a line\nforged`},
		{"row\tcell\rover", "\t", `row` + "\t" + `cell\rover`},
		{"job-1\u200b", "", `job-1\u200b`},
		{"rev\u202eesrever", "", `rev\u202eesrever`},
		{"job-1\u00a0", "", `job-1\u00a0`},
		{"job-1\u3000", "", `job-1\u3000`},
		{"job-1\u3164", "", `job-1\u3164`},
		{"job-1\u2800", "", `job-1\u2800`},
		{"job-1\u034f", "", `job-1\u034f`},
		{"job-1\ufe0f", "", `job-1\ufe0f`},
		{"ok \u2764\ufe0f", "", "ok \u2764\ufe0f"},
		{"\x1b[2K", "\n\t\r", `\x1b[2K`},
		{"naïve café", "", "naïve café"},
	} {
		if got := String(tc.in, tc.keep); got != tc.want {
			t.Errorf("String(%q, %q) = %q, want %q", tc.in, tc.keep, got, tc.want)
		}
	}
}

func TestJobIDWritesOutTheSpacesAPageWouldFold(t *testing.T) {
	for in, want := range map[string]string{
		"job-1":  "job-1",
		"job 1":  "job 1",
		"job-1 ": `job-1\x20`,
		" job-1": `\x20job-1`,
		"job  1": `job\x20\x201`,
		"a b  c": `a b\x20\x20c`,
	} {
		if got := JobID(in); got != want {
			t.Errorf("JobID(%q) = %q, want %q", in, got, want)
		}
	}
}
