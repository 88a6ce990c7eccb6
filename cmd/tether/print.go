package main

import (
	"fmt"
	shown "github.com/tetherhq/tether/internal/printable"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// addPrintFlag gives a command that creates something --print FIELD, which
// prints that one field of the answer and nothing else, for a shell to
// capture: PLANNER_CREDENTIAL=$(tether agent register ... --print credential).
func addPrintFlag(cmd *cobra.Command, fields ...string) {
	cmd.Flags().String("print", "", "print only this field of the answer, for a shell variable: "+strings.Join(fields, ", "))
	_ = cmd.Flags().SetAnnotation("print", printFields, fields)
}

const printFields = "print-fields"

// checkPrintFlag refuses a --print field the command does not print, before
// the command changes anything on the server.
func checkPrintFlag(cmd *cobra.Command) error {
	flag := cmd.Flags().Lookup("print")
	if flag == nil || flag.Value.String() == "" {
		return nil
	}
	fields := flag.Annotations[printFields]
	for _, f := range fields {
		if f == flag.Value.String() {
			return nil
		}
	}
	return fmt.Errorf("--print %q: want one of %s", flag.Value.String(), strings.Join(fields, ", "))
}

// printedAsAsked prints the one field --print names, or the whole answer
// as JSON under -o json; done says whether it printed (or failed trying),
// so the caller prints its own rendering only when not.
func (g *globals) printedAsAsked(cmd *cobra.Command, msg proto.Message) (done bool, err error) {
	if printed, err := printOneField(cmd, msg); printed || err != nil {
		return true, err
	}
	return g.printedAsJSON(cmd.OutOrStdout(), msg)
}

// printOneField prints the field --print names, if the command has the
// flag and it is set; printed says whether it did.
func printOneField(cmd *cobra.Command, msg proto.Message) (printed bool, err error) {
	flag := cmd.Flags().Lookup("print")
	if flag == nil || flag.Value.String() == "" {
		return false, nil
	}
	v, ok := findField(msg.ProtoReflect(), flag.Value.String())
	if !ok {
		return false, fmt.Errorf("--print %q: the answer has no such field; %s", flag.Value.String(), flag.Usage)
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), v)
	return true, err
}

// findField finds a field by its name (node_id, credential, grant_id) or
// path (node.node_id) in m, or one message down when the name is unique
// enough to mean it (node_id in a SpawnResponse is node.node_id).
func findField(m protoreflect.Message, name string) (string, bool) {
	if head, rest, ok := strings.Cut(name, "."); ok {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(head))
		if fd == nil || fd.Message() == nil || fd.IsList() || fd.IsMap() {
			return "", false
		}
		return findField(m.Get(fd).Message(), rest)
	}
	fields := m.Descriptor().Fields()
	if fd := fields.ByName(protoreflect.Name(name)); fd != nil && !fd.IsList() && !fd.IsMap() {
		return formatField(m, fd), true
	}
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Message() == nil || fd.IsList() || fd.IsMap() || isTimestamp(fd) {
			continue
		}
		if v, ok := findField(m.Get(fd).Message(), name); ok {
			return v, true
		}
	}
	return "", false
}

func isTimestamp(fd protoreflect.FieldDescriptor) bool {
	return fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Timestamp"
}

func formatField(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	v := m.Get(fd)
	switch {
	case isTimestamp(fd):
		ts := &timestamppb.Timestamp{}
		proto.Merge(ts, v.Message().Interface())
		return ts.AsTime().UTC().Format(time.RFC3339)
	case fd.Enum() != nil:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
	}
	return v.String()
}

// roleName is a role as users type it (--role security).
func roleName(r tetherv1.Role) string {
	if r == tetherv1.Role_ROLE_UNSPECIFIED {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// printable is s as it may reach an operator's terminal. Much of what the
// CLI prints was written by the agents it reports on (a stop proposal's
// reason, a termination an agent requested, a privilege's external id, a
// hook's answer), so a control character — a carriage return, an escape
// sequence that moves the cursor or erases a line, a line break before a
// forged line — a bidirectional override, an invisible character (a
// zero-width space or joiner, a byte-order mark, a soft hyphen) or one
// drawn as a blank (a no-break or ideographic space, a Hangul filler) is
// shown escaped, as Go quotes it (\r, \x1b, \n, \u202e, \u200b, \u00a0), and
// never acts on the terminal nor makes two different ids print alike
// ("job-1" and "job-1\u200b"). The console shows the same text by the same
// rule (internal/printable).
func printable(s string) string { return shown.String(s, "") }

// inertJSON is JSON text b with every character printable writes out
// (shown.Hidden: a C1 control, DEL, a bidirectional control, an invisible
// character, a space other than ASCII's) written as a JSON escape
// (\u009b, \u202e, \ud83d\ude00 past U+FFFF): the same JSON, read back as
// the same strings, that acts on no terminal. The JSON encoders escape
// the C0 controls and leave the rest as they are, so a rogue's reason
// with CSI written as UTF-8 ("\u009b1A\u009b2K"; VTE's terminals, GNU
// screen and Mosh act on the C1 controls so written) moved the cursor up
// and erased the line above in `tether record show -o json`, where the
// summary printed it escaped. Such a character can stand only within a
// JSON string: the text outside strings is ASCII.
func inertJSON(b []byte) []byte {
	var out []byte
	prev := rune(0)
	for i := 0; i < len(b); {
		r, size := rune(b[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRune(b[i:])
		}
		if r >= 0x7f && r != utf8.RuneError && shown.Hidden(prev, r) {
			if out == nil {
				out = append(make([]byte, 0, len(b)+32), b[:i]...)
			}
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		} else if out != nil {
			out = append(out, b[i:i+size]...)
		}
		prev = r
		i += size
	}
	if out == nil {
		return b
	}
	return out
}

// printableJob is a job id as printable shows it, with a space at either
// end or beside another written \x20: a terminal shows "job-1 " as it
// shows "job-1".
func printableJob(s string) string { return printable(shown.JobID(s)) }

// printableList is a list of the agents' strings as fmt's %v prints one
// ([a b c]), each printable.
func printableList(items []string) string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = printable(s)
	}
	return "[" + strings.Join(out, " ") + "]"
}

// printableJobs is a list of job ids as printableList prints one, each as
// printableJob shows it.
func printableJobs(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = shown.JobID(id)
	}
	return printableList(out)
}
