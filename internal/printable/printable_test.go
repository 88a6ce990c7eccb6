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

func TestStringWritesOutLettersThatReadAsOthers(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// A Latin word with a letter of another script in it.
		{"\u0458ob-1", `\u0458ob-1`},                     // Cyrillic je
		{"w\u043erker", `w\u043erker`},                   // Cyrillic o
		{"j\u03bfb-1", `j\u03bfb-1`},                     // Greek omicron
		{"kap\u0131", `kap\u0131`},                       // dotless i beside ASCII letters
		{"\u0458\u043e\u042c-1", `\u0458\u043e\u042c-1`}, // every letter a look-alike: reads "job"
		{"\u0430\u0441\u0435", `\u0430\u0441\u0435`},     // "ace", all Cyrillic
		{"\u13aa\u13df\u13ac", `\u13aa\u13df\u13ac`},     // "ACE" in Cherokee
		// An ASCII letter or digit drawn in another style.
		{"\uff4aob-1", `\uff4aob-1`},         // fullwidth j
		{"job-\U0001d7cf", `job-\U0001d7cf`}, // mathematical bold 1
		{"\u212aey", `\u212aey`},             // the Kelvin sign
		{"job-\u2160", `job-\u2160`},         // Roman numeral one
		// What reads as itself stays.
		{"naïve café", "naïve café"},
		{"Привет, мир", "Привет, мир"},
		{"стоп: job-1 завис", "стоп: job-1 завис"},
		{"Ωμέγα", "Ωμέγα"},
		{"東京タワー tokyo", "東京タワー tokyo"},
		{"ジョブ1", "ジョブ1"},
		{"ok \u2764\ufe0f", "ok \u2764\ufe0f"},
		{"e\u0301", "e\u0301"},
	} {
		if got := String(tc.in, ""); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRogue38DStringWritesOutAStackOfMarks: a run of combining marks is
// shown up to MaxMarks and written out past them; a page drew a rogue's
// five hundred marks as a column of ink over the rows beside its own.
func TestRogue38DStringWritesOutAStackOfMarks(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"e\u0301", "e\u0301"},
		{"Vi\u1ec7t", "Vi\u1ec7t"},
		{"Vie\u0323\u0302t", "Vie\u0323\u0302t"},                             // decomposed: two marks
		{"\u05e9\u05bc\u05c1\u05b8\u0591", "\u05e9\u05bc\u05c1\u05b8\u0591"}, // Hebrew: four marks
		{"ok\u0300\u0301\u0302\u0303\u0304\u0305\u0306", "ok\u0300\u0301\u0302\u0303" + `\u0304\u0305\u0306`},
		{"a\u0300\u0301\u0302\u0303\u0304 b\u0300", "a\u0300\u0301\u0302\u0303" + `\u0304` + " b\u0300"},
		{"o\u20dd\u20dd\u20dd\u20dd\u20dd", "o\u20dd\u20dd\u20dd\u20dd" + `\u20dd`},
	} {
		if got := String(tc.in, ""); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
