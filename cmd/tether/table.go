package main

import (
	"io"
	"strings"
	"unicode"

	"golang.org/x/text/width"
)

// table aligns the CLI's tables as text/tabwriter does (NewWriter(w, 0,
// 4, 2, ' ', 0): cells ended by a tab, a column block as wide as its
// widest cell plus two spaces), but measures a cell in the columns a
// terminal draws it in, not in characters: a wide character (CJK, a
// fullwidth form, an emoji) takes two, a combining mark none. tabwriter
// counted one for each, so a job id or a reason of an agent's choosing
// in wide characters pushed the rest of its row to the right, and one of
// combining marks pulled it to the left, under other columns' headings:
// the row read as other values than it held.
type table struct {
	w   io.Writer
	buf []byte
}

func newTable(w io.Writer) *table { return &table{w: w} }

func (t *table) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// Flush writes what was written since the last Flush, aligned.
func (t *table) Flush() error {
	text := string(t.buf)
	t.buf = t.buf[:0]
	var lines [][]string
	var newline []bool
	for _, l := range strings.SplitAfter(text, "\n") {
		if l == "" {
			continue
		}
		body, nl := strings.CutSuffix(l, "\n")
		lines = append(lines, strings.Split(body, "\t"))
		newline = append(newline, nl)
	}
	var b strings.Builder
	f := tableFormat{lines: lines, newline: newline, out: &b}
	f.format(0, len(lines))
	_, err := io.WriteString(t.w, b.String())
	return err
}

// tableFormat is tabwriter's format over a table's lines (each its cells,
// the last one the text after the last tab).
type tableFormat struct {
	lines   [][]string
	newline []bool
	widths  []int
	out     *strings.Builder
}

func (f *tableFormat) format(line0, line1 int) {
	column := len(f.widths)
	for this := line0; this < line1; this++ {
		if column >= len(f.lines[this])-1 {
			continue
		}
		// A cell in this column: a block of lines that have one begins.
		f.write(line0, this)
		line0 = this
		w := 0
		for ; this < line1; this++ {
			line := f.lines[this]
			if column >= len(line)-1 {
				break
			}
			w = max(w, termWidth(line[column])+2)
		}
		f.widths = append(f.widths, w)
		f.format(line0, this)
		f.widths = f.widths[:len(f.widths)-1]
		line0 = this
	}
	f.write(line0, line1)
}

func (f *tableFormat) write(line0, line1 int) {
	for i := line0; i < line1; i++ {
		for j, c := range f.lines[i] {
			f.out.WriteString(c)
			if j < len(f.widths) {
				f.out.WriteString(strings.Repeat(" ", max(0, f.widths[j]-termWidth(c))))
			}
		}
		if f.newline[i] {
			f.out.WriteByte('\n')
		}
	}
}

// termWidth is the number of columns a terminal draws s in: two for a wide
// or fullwidth character (East Asian Width W or F), none for a combining
// mark or a format character, one for any other.
func termWidth(s string) int {
	n := 0
	for _, r := range s {
		switch {
		case r < 0x80:
			n++
		case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		default:
			switch width.LookupRune(r).Kind() {
			case width.EastAsianWide, width.EastAsianFullwidth:
				n += 2
			default:
				n++
			}
		}
	}
	return n
}
