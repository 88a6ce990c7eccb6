package mcpgate_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherhq/tether/agentsdk/mcpgate"
)

// The twentieth rogue pass against the gateway: a rogue agent holding its
// own valid token, and a rogue upstream.

// firstMessage is the first JSON-RPC message of an answer (a JSON body, or
// the first event of an event stream), and whether the answer then ended.
// An answer that goes on after its first message is closed unread.
func firstMessage(t *testing.T, resp *http.Response) (msg map[string]any, ended bool) {
	t.Helper()
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var data string
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for {
			line, err := br.ReadString('\n')
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = d
				break
			}
			if err != nil {
				t.Fatalf("the event stream ended before its first message: %v", err)
			}
		}
	} else {
		b, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		data = string(b)
	}
	if err := json.Unmarshal([]byte(data), &msg); err != nil {
		t.Fatalf("the answer's first message %q: %v", data, err)
	}
	if msg["id"] == nil {
		// A notification first (the listen's acknowledgement): the answer goes
		// on; the request is held open.
		return msg, false
	}
	rest, err := io.ReadAll(br) // an answer held open blocks here: the first message said it is done
	if err != nil {
		t.Fatal(err)
	}
	return msg, strings.TrimSpace(string(rest)) == ""
}

// A rogue agent cannot hold streams open on the gateway beyond its bounds
// with subscriptions/listen. The Go SDK's server answers that method (of
// the 2026-07-28 revision of MCP) in any session, whatever revision the
// session speaks: it acknowledges, then holds the request open until the
// agent leaves, a goroutine and a connection each. The gateway counts a
// node's tools/call and tools/list and bounds its sessions, but a listen
// was neither: one session held as many as the rogue opened, with no
// request idle, past every connection limit. The gateway now answers only
// the methods it passes (tools, and the session's own: initialize, ping,
// logging) and refuses the rest, by name, before the SDK runs them; its
// tools' list changes still reach every session on its stream.
func TestARogueCannotHoldStreamsOpenWithSubscriptionsListen(t *testing.T) {
	w := newWorld(t, "mcp:test/*")
	s := openRaw(t, w.endpoint, w.grant.Token)
	for i := range 2 * mcpgate.DefaultMaxSessionsPerNode {
		req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(fmt.Sprintf(
			`{"jsonrpc":"2.0","id":%d,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}`, 100+i)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+w.grant.Token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", s.id)
		req.Header.Set("Mcp-Protocol-Version", rawVersion)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, ended := firstMessage(t, resp)
		e, _ := msg["error"].(map[string]any)
		if e == nil || e["code"] != float64(mcpgate.CodeNotGated) || !strings.Contains(fmt.Sprint(e["message"]), "subscriptions/listen") || !ended {
			t.Fatalf("listen #%d: the gateway answered %v (the answer ended: %v); want it refused (%d, naming the method) and the answer ended", i+1, msg, ended, mcpgate.CodeNotGated)
		}
	}
	// The session still calls its tools.
	resp, body := s.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"still here"}}}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "still here") {
		t.Fatalf("a call after the listens: %s %.300s", resp.Status, body)
	}
}
