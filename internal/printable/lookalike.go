package printable

import (
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// A letter can read as another without being hidden: a Cyrillic "ј" in
// "јob-1" reads as the Latin "j" of "job-1", a fullwidth "ｊ" or a
// mathematical "𝐣" is an ASCII "j" drawn in another style, and a Cyrillic
// "асе" reads as the Latin "ace". Unicode's security mechanisms (UTS #39)
// judge an identifier by its scripts and by a table of confusables; the
// rule here is a small part of that, applied to each word (a run of
// letters, marks and digits) of an agent's text:
//
//   - a letter or digit whose compatibility form (NFKC) is ASCII, but
//     which is not ASCII itself, is written out (fullwidth, mathematical,
//     the Kelvin sign, Roman numerals, ligatures, superscripts);
//   - a word that mixes scripts is written out, every character of it that
//     is not ASCII ("\u0458ob"): a word may mix Latin with Han, Hiragana,
//     Katakana, Bopomofo or Hangul as Japanese, Chinese and Korean text do
//     (UTS #39's "highly restrictive" level), and nothing else;
//   - a word whose every letter is ASCII or reads as an ASCII one
//     (lookalikes: Cyrillic "а", "е", "о", "р", "с", Greek "ο", Armenian
//     "օ", Cherokee "Ꭺ", the dotless "ı", …), one of them at least, reads as
//     an ASCII word and is written out the same way.
//
// Text in one script reads as itself: "Привет, мир", "Ωμέγα", "naïve café",
// "東京タワー" are shown as they are. A word of another script made only of
// letters that look Latin ("как") is written out, the price of telling
// "асе" from "ace". The table is the common cases of Unicode's
// confusables list, not all of it: a look-alike it does not hold, in a
// word of one script, still reads as what it looks like.

// lookalike holds the letters and digits outside ASCII that read as an
// ASCII one in common fonts.
var lookalike = map[rune]bool{}

func init() {
	for _, r := range "" +
		// Cyrillic
		"аеорсухѕіјԁԛԝһӏүьАВЕКМНОРСТХЅІЈҮԚԜҺӀЬЗ" +
		// Greek
		"οαινρκυΑΒΕΖΗΙΚΜΝΟΡΤΥΧ" +
		// Armenian
		"օոսհցզՏՕՍ" +
		// Cherokee
		"ᎪᏴᏟᎬᎻᏆᎫᏦᎷᏢᏚᎢᏙᎳᏃ" +
		// Latin without a mark that reads as ASCII: dotless i, alpha,
		// script g, dental click
		"ıɑɡǀɩ" +
		// digits that read as 1
		"١۱" {
		lookalike[r] = true
	}
}

// word reports whether r belongs to a word: a letter, a mark or a number.
func word(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r)
}

// styled reports whether r, not ASCII, is an ASCII letter or digit drawn
// in another style: its compatibility form is ASCII letters and digits.
func styled(r rune) bool {
	if r < utf8.RuneSelf || !word(r) || unicode.IsMark(r) {
		return false
	}
	k := norm.NFKC.String(string(r))
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return k != ""
}

// readsAsOther reports whether the word w (a run of word runes) reads as
// another: it mixes scripts, or every letter of it is ASCII or a
// lookalike, one of them at least a lookalike.
func readsAsOther(w string) bool {
	var scripts []*unicode.RangeTable
	asciiLike, alike := true, false
	for _, r := range w {
		if r < utf8.RuneSelf {
			if isASCIILetter(r) {
				scripts = addScript(scripts, unicode.Latin)
			}
			continue
		}
		if lookalike[r] {
			alike = true
		} else if !unicode.IsMark(r) {
			asciiLike = false
		}
		if s := scriptOf(r); s != nil {
			scripts = addScript(scripts, s)
		}
	}
	return alike && asciiLike || mixed(scripts)
}

func isASCIILetter(r rune) bool { return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' }

func addScript(scripts []*unicode.RangeTable, s *unicode.RangeTable) []*unicode.RangeTable {
	for _, x := range scripts {
		if x == s {
			return scripts
		}
	}
	return append(scripts, s)
}

// mixed: more than one script, unless Latin with those of one of the
// East Asian writing systems.
func mixed(scripts []*unicode.RangeTable) bool {
	if len(scripts) < 2 {
		return false
	}
	for _, system := range eastAsian {
		all := true
		for _, s := range scripts {
			if s != unicode.Latin && !system[s] {
				all = false
				break
			}
		}
		if all {
			return false
		}
	}
	return true
}

var eastAsian = []map[*unicode.RangeTable]bool{
	{unicode.Han: true, unicode.Hiragana: true, unicode.Katakana: true},
	{unicode.Han: true, unicode.Bopomofo: true},
	{unicode.Han: true, unicode.Hangul: true},
}

// commonScripts are tried first; any other is found in unicode.Scripts.
var commonScripts = []*unicode.RangeTable{
	unicode.Latin, unicode.Cyrillic, unicode.Greek, unicode.Han, unicode.Hiragana, unicode.Katakana,
	unicode.Hangul, unicode.Arabic, unicode.Hebrew, unicode.Armenian, unicode.Cherokee,
}

// scriptOf is r's script, nil for Common and Inherited (digits,
// punctuation, combining marks), which belong to any word.
func scriptOf(r rune) *unicode.RangeTable {
	if unicode.Is(unicode.Common, r) || unicode.Is(unicode.Inherited, r) {
		return nil
	}
	for _, s := range commonScripts {
		if unicode.Is(s, r) {
			return s
		}
	}
	for _, s := range unicode.Scripts {
		if unicode.Is(s, r) {
			return s
		}
	}
	return nil
}
