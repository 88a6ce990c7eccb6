// Command agent is a minimal agent built on agentsdk: it joins the control
// plane with the credential its parent (or an operator) obtained for it,
// keeps its session (which refreshes its credential), calls a tool with a
// capability token it refreshes for as long as the grant lives, until told
// to drain, then confirms its exit. examples/README.md has the commands.
//
//	tether agent register --name demo-agent --print credential > agent.cred
//	NODE=$(tether whoami --token-file agent.cred --print node_id)
//	GRANT=$(tether grant root --holder "$NODE" --scope tool:echo --ttl 1h --print grant_id)
//	go run ./examples/agent --credential-file agent.cred --grant "$GRANT" --tool http://127.0.0.1:8081/echo
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tetherhq/tether/agentsdk"
)

func main() {
	addr := flag.String("addr", addrFromEnv(), "control plane address ($TETHER_ADDR)")
	credFile := flag.String("credential-file", "", "file with the agent's credential")
	grantID := flag.String("grant", "", "id of the grant whose capability token the agent presents to the tool")
	tool := flag.String("tool", "http://127.0.0.1:8081/echo", "tool URL")
	every := flag.Duration("every", time.Second, "time between tool calls")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *grantID == "" {
		fmt.Fprintln(os.Stderr, "--grant is required")
		os.Exit(2)
	}
	agent, err := agentsdk.Join(ctx, *addr, mustRead(*credFile), nil)
	if err != nil {
		log.Fatalf("join: %v", err)
	}
	log.Printf("joined as %s", agent)
	// A token lives minutes, the grant as long as its TTL: the source
	// refreshes the token (the control plane re-checks the chain) before it
	// expires.
	capability, err := agent.CapabilityTokenFor(ctx, *grantID)
	if err != nil {
		log.Fatalf("capability token for %s: %v", *grantID, err)
	}
	agent.OnDrain(func(s agentsdk.Signal) { log.Printf("told to stop (abort=%v): %s", s.Abort, s.Reason) })
	go func() {
		if err := agent.Run(ctx); err != nil {
			log.Printf("session ended: %v", err)
		}
	}()

	client := &http.Client{Timeout: 30 * time.Second}
	for {
		select {
		case <-agent.Draining():
			// Finish nothing more, start nothing new, say we are gone.
			if err := agent.Exit(context.WithoutCancel(ctx), "drained"); err != nil {
				log.Printf("confirm exit: %v", err)
			}
			log.Print("exited")
			return
		case <-ctx.Done():
			return
		case <-time.After(*every):
		}
		before := capability.Grant().ExpiresAt
		token, err := capability.Token(agent.Context())
		if err != nil {
			log.Printf("capability token: %v", err)
			continue
		}
		if after := capability.Grant().ExpiresAt; !after.Equal(before) {
			log.Printf("capability token refreshed; it expires at %s", after.Format(time.RFC3339))
		}
		req, _ := http.NewRequestWithContext(agent.Context(), http.MethodPost, *tool, strings.NewReader("hello"))
		req.Header.Set(agentsdk.CapabilityHeader, token)
		resp, err := client.Do(req)
		if err != nil {
			log.Printf("tool: %v", err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		log.Printf("tool answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
}

func mustRead(path string) string {
	if path == "" {
		fmt.Fprintln(os.Stderr, "--credential-file is required")
		os.Exit(2)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// addrFromEnv is $TETHER_ADDR, as the CLI reads it, or the local default.
func addrFromEnv() string {
	addr := os.Getenv("TETHER_ADDR")
	switch {
	case addr == "":
		return "http://127.0.0.1:7420"
	case !strings.Contains(addr, "://"):
		return "http://" + addr
	}
	return addr
}
