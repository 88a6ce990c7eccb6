// Package printable holds the one rule for showing an agent's text to a
// person: which characters are written out as Go quotes them (\x1b,
// \u200b, \u00a0) instead of being shown as they are.
//
// Much of what the console and the CLI show was written by the agents they
// report on — job ids, node names, a stop proposal's reason, a lease's
// progress, a hook's answer — and the control plane takes nearly any
// character in them. A character that acts on the text rather than shows
// in it would let a rogue forge lines, reverse a cell, or hold a job id
// that reads like another's ("job-1\u200b", "job-1\u00a0" beside
// "job-1"); so would a letter that reads as another ("\u0458ob-1", a
// Cyrillic je: lookalike.go). The console (controlplane/console) and the
// CLI (cmd/tether) both show such text through String, so the two never
// disagree on what an operator sees.
package printable

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Hidden reports whether r, following prev, is written out rather than
// shown: a control character (a carriage return, an escape sequence, a line
// break before a forged line), a bidirectional control (an override
// reverses what follows it), an invisible character (a zero-width space or
// joiner, a byte-order mark, a soft hyphen, a line or paragraph separator:
// Unicode's Cf, Zl and Zp), or a character drawn as a blank or as nothing
// that is none of those: a space other than the ASCII one (no-break,
// ideographic, the sized spaces: Zs), a Hangul filler, the braille blank,
// the combining grapheme joiner; and a variation selector after an ASCII
// character, which selects nothing there (after an emoji it is the
// emoji's presentation, and stays).
func Hidden(prev, r rune) bool {
	if r == ' ' {
		return false
	}
	return unicode.IsControl(r) || unicode.In(r, unicode.Bidi_Control, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Zs) ||
		r == 0x115f || r == 0x1160 || r == 0x3164 || r == 0xffa0 || r == 0x2800 || r == 0x034f ||
		variationSelector(r) && prev < utf8.RuneSelf
}

// variationSelector: U+FE00–FE0F and U+E0100–E01EF.
func variationSelector(r rune) bool {
	return r >= 0xfe00 && r <= 0xfe0f || r >= 0xe0100 && r <= 0xe01ef
}

// Escape is r as Go writes it in a quoted string: \u200b, \x1b, and the
// ASCII space as \x20.
func Escape(r rune) string {
	if r == ' ' {
		return `\x20`
	}
	q := strconv.QuoteToASCII(string(r))
	return q[1 : len(q)-1]
}

// MaxMarks is how many combining marks (Unicode's Mn and Me) in a row are
// shown as they are; the later marks of a longer run are written out. A
// page or a terminal draws each mark over the one before, above or below
// its letter, so a rogue's reason of "ok" and five hundred marks was drawn
// as a column of ink over the rows above and below its own, striking
// through other nodes' cells. Text in any script holds a few marks on a
// letter at most (Vietnamese two, Hebrew and Thai three or four).
const MaxMarks = 4

// String is s with every Hidden character written out (Escape), but for
// the ASCII characters in keep, shown as they are (the console keeps line
// breaks and tabs, which its pages show as such; a CLI table row keeps its
// tabs, which separate its cells); and with every character written out
// that makes a word read as another (lookalike.go: "\u0458ob-1" for a
// Cyrillic "јob-1"), and every combining mark past the first MaxMarks of
// a run of them. s is returned as it is when it has nothing to write
// out, with a fast path for ASCII: a 10,000-node tree page is 2.6 MB,
// nearly all of it ASCII.
func String(s, keep string) string {
	if !has(s, keep) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	prev := rune(0)
	otherWord, wordEnd := false, 0
	marks := 0
	for i, r := range s {
		if i >= wordEnd && word(r) {
			wordEnd = i + wordLen(s[i:])
			otherWord = readsAsOther(s[i:wordEnd])
		}
		if r >= utf8.RuneSelf && unicode.In(r, unicode.Mn, unicode.Me) {
			marks++
		} else {
			marks = 0
		}
		switch {
		case Hidden(prev, r) && !kept(r, keep),
			marks > MaxMarks,
			r >= utf8.RuneSelf && i < wordEnd && (otherWord || styled(r)):
			b.WriteString(Escape(r))
		default:
			b.WriteRune(r)
		}
		prev = r
	}
	if b.Len() == len(s) && b.String() == s {
		return s
	}
	return b.String()
}

// wordLen is the length in bytes of the word s starts with.
func wordLen(s string) int {
	for i, r := range s {
		if !word(r) {
			return i
		}
	}
	return len(s)
}

func kept(r rune, keep string) bool {
	return r < utf8.RuneSelf && strings.IndexByte(keep, byte(r)) >= 0
}

// has reports whether String may write anything of s out: a Hidden
// character, or a word with a character outside ASCII in it.
func has(s, keep string) bool {
	prev := rune(0)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && strings.IndexByte(keep, c) < 0 {
				return true
			}
			prev = rune(c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if Hidden(prev, r) || word(r) {
			return true
		}
		prev = r
		i += size
	}
	return false
}

// JobID is a job id as a page or a terminal shows it, for its spaces: a job
// id is any characters but control ones, and a page trims a cell's spaces
// and folds a run of them into one (a terminal shows a trailing one as
// nothing), so "job-1 ", " job-1" and "job-1" read alike. A space at either
// end or beside another is written \x20; a job id without such a space is
// returned as it is. The id's other characters are String's to judge.
func JobID(s string) string {
	if !strings.HasPrefix(s, " ") && !strings.HasSuffix(s, " ") && !strings.Contains(s, "  ") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' && (i == 0 || i == len(s)-1 || s[i-1] == ' ' || s[i+1] == ' ') {
			b.WriteString(`\x20`)
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
