package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tetherhq/tether/agentsdk"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// clients is one Connect client per service, assembled by agentsdk.Dial.
type clients = agentsdk.Conn

// httpClient speaks HTTP/2 to the control plane: cleartext (h2c) for http://
// addresses, TLS for https:// (with --tls-ca and a client certificate when
// given).
func (g *globals) httpClient() (*http.Client, error) {
	if g.tlsCA == "" && g.tlsClientCert == "" && g.tlsClientKey == "" {
		return agentsdk.HTTP2Client(g.addr), nil
	}
	cfg, err := agentsdk.TLSConfig(g.tlsCA, g.tlsClientCert, g.tlsClientKey)
	if err != nil {
		return nil, err
	}
	return agentsdk.HTTP2ClientTLS(g.addr, cfg), nil
}

// resolveToken finds the bearer token in the order `tether --help`
// documents. A token given but empty is an error, never a fall back to the
// local admin token: an unset $PLANNER_CREDENTIAL must not turn a call
// into the operator's.
func (g *globals) resolveToken() (string, error) {
	if g.tokenGiven || g.token != "" {
		if strings.TrimSpace(g.token) == "" {
			return "", errors.New("--token is empty (an unset variable?); pass a token, or leave --token out to use $TETHER_TOKEN, --token-file or the local admin token")
		}
		return g.token, nil
	}
	if v, ok := os.LookupEnv("TETHER_TOKEN"); ok {
		if strings.TrimSpace(v) == "" {
			return "", errors.New("$TETHER_TOKEN is set but empty; unset it to use --token-file or the local admin token")
		}
		return v, nil
	}
	file := g.tokenFile
	if file == "" {
		if !isLocal(g.addr) {
			return "", fmt.Errorf("no token for %s: pass --token or --token-file, or set TETHER_TOKEN", g.addr)
		}
		file = filepath.Join(g.dataDir, "admin.token")
		b, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("no token: %s does not exist; point --data-dir (or $TETHER_DATA_DIR) at the directory `tether serve` uses, or pass --token, --token-file or $TETHER_TOKEN", file)
		}
		if err != nil {
			return "", fmt.Errorf("read the local admin token: %w", err)
		}
		return nonEmptyToken(b, file)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read --token-file: %w", err)
	}
	return nonEmptyToken(b, file)
}

func nonEmptyToken(b []byte, file string) (string, error) {
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return token, nil
}

func isLocal(addr string) bool {
	u, err := url.Parse(addr)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (g *globals) clients() (*clients, error) {
	token, err := g.resolveToken()
	if err != nil {
		return nil, err
	}
	hc, err := g.httpClient()
	if err != nil {
		return nil, err
	}
	return agentsdk.Dial(g.addr, token, agentsdk.WithHTTPClient(hc)), nil
}

// dialed is a command's RunE that dials the control plane before run.
func (g *globals) dialed(run func(cmd *cobra.Command, args []string, c *clients) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.clients()
		if err != nil {
			return err
		}
		return run(cmd, args, c)
	}
}

// answer is a call's answer, or the call's error:
// return answer(c.Lease.Ack(ctx, req)).
func answer[R any](resp *connect.Response[R], err error) (*R, error) {
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// carried refuses an answer that lacks the object the command printed or
// acted on (present: the answer holds it, with its id), or that carries
// another than the one asked for (got, when asked is not ""): the control
// plane's answers always carry the one asked for, so a path to it that
// forged the answer (a proxy, a replica under a rogue's control) is told,
// not read as if it held one (a nil dereference, an empty token printed or
// written, another grant printed under the id asked for). It is the
// console's answered (both agentsdk.AnswerCarries), its ids written for
// the terminal.
func carried(kind, asked, got string, present bool) error {
	return agentsdk.AnswerCarries(kind, asked, got, present, printable)
}

// somePages collects the pages of a paged list from token on until it holds
// limit items, calls listings were read or the list ends, and returns them
// and the next page's token ("" at the end). page fetches the page a token
// names with at most size items. A listing an agent can grow (grants it
// delegated and revoked, leases of jobs it chose the ids of) is read so,
// never whole.
func somePages[T any](limit, calls int, token string, page func(token string, size int32) ([]T, string, error)) ([]T, string, error) {
	var all []T
	for range calls {
		items, next, err := page(token, int32(min(limit-len(all), 1000)))
		if err != nil {
			return nil, "", err
		}
		all = append(all, items...)
		if token = next; token == "" || len(all) >= limit {
			break
		}
	}
	return all, token, nil
}

// nextPageLine is the line a listing cut at --limit ends with: the command
// that prints the next page (command, the page token, then the flags that
// chose the listing, each a name and its value, the empty ones left out).
// With -o json it goes to stderr, so that stdout stays JSON, and the
// answer is "".
func nextPageLine(g *globals, cmd *cobra.Command, command, token string, flags ...string) string {
	if token == "" {
		return ""
	}
	more := "… more: " + command + " --page-token " + token
	for i := 0; i+1 < len(flags); i += 2 {
		if flags[i+1] != "" {
			more += " " + flags[i] + " " + flags[i+1]
		}
	}
	if asJSON, _ := g.wantJSON(); asJSON {
		fmt.Fprintln(cmd.ErrOrStderr(), more)
		return ""
	}
	return more
}

// printJSON writes a message as indented protojson (the same shape curl
// sees), with no character that acts on a terminal (inertJSON).
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(inertJSON(b)))
	return err
}

// printJSONList writes messages as a JSON array.
func printJSONList[M proto.Message](w io.Writer, ms []M) error {
	raw := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		raw = append(raw, b)
	}
	b, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(inertJSON(b)))
	return err
}

// printedAsJSON prints msg as JSON if -o json asks for it; done says
// whether it did (or failed trying), so the caller prints no table.
func (g *globals) printedAsJSON(w io.Writer, msg proto.Message) (done bool, err error) {
	return g.printedJSON(func() error { return printJSON(w, msg) })
}

// printedAsJSONList is printedAsJSON for a list.
func printedAsJSONList[M proto.Message](g *globals, w io.Writer, ms []M) (done bool, err error) {
	return g.printedJSON(func() error { return printJSONList(w, ms) })
}

// printList prints items as a JSON list under -o json, else as a table:
// header, then row(item)'s cells for each item, each cell as tableCell
// shows it: printable whole (a tab in an agent's text is written out, \t,
// like any other control character, never taken for the end of its cell:
// a rogue's stop reason "calm\tt_forged" read as a TERMINATION column of
// its own), its spaces that would read as a gap between cells written out,
// and, unless -o wide, cut at maxCell columns — all but the first: each
// table's first column is the row's id (a proposal's, a node's, a job's),
// what the operator types into the next command, kept whole so that two
// long job ids of an agent's never print alike.
func printList[M proto.Message](g *globals, w io.Writer, items []M, header string, row func(M) []string) error {
	if done, err := printedAsJSONList(g, w, items); done || err != nil {
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, header)
	for _, item := range items {
		cells := row(item)
		for i, c := range cells {
			cells[i] = tableCell(c, i == 0 || g.output == "wide")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// maxCell is the most columns a table cell takes unless -o wide: a column
// is as wide as its widest cell, and a reason, a label set or an
// expression of an agent's may be a kilobyte — a stop reason of 1 KiB made
// every row of tether proposal ls 1,100 columns wide, its TERMINATION a
// screen away and each row wrapped into lines that began mid-row.
const maxCell = 60

// cutMarker ends a cell cut at maxCell columns, naming what prints it whole.
const cutMarker = "…(cut: -o wide)"

// tableCell is s as a table cell shows it: printable, with a space at
// either end or beside another written out (\x20), as a job id is — a run
// of spaces inside an agent's text read as the gap between two cells, the
// text after it as the next column's ("calm" and thirty spaces before
// "t_forged" in a stop reason) — and, unless wide, cut to maxCell columns
// with cutMarker.
func tableCell(s string, wide bool) string {
	s = printableJob(s)
	if wide || termWidth(s) <= maxCell {
		return s
	}
	keep := maxCell - termWidth(cutMarker)
	n := 0
	for i, r := range s {
		if n += termWidth(string(r)); n > keep {
			return s[:i] + cutMarker
		}
	}
	return s
}

func (g *globals) printedJSON(print func() error) (done bool, err error) {
	asJSON, err := g.wantJSON()
	if err != nil || !asJSON {
		return err != nil, err
	}
	return true, print()
}

func (g *globals) wantJSON() (bool, error) {
	switch g.output {
	case "json":
		return true, nil
	case "table", "wide", "":
		return false, nil
	default:
		return false, fmt.Errorf("-o %q: want table, wide or json", g.output)
	}
}
