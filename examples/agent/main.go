// Command agent is a minimal agent built on agentsdk: it joins the control
// plane with the credential its parent (or an operator) obtained for it,
// keeps its session, calls a tool with its capability token until told to
// drain, then confirms its exit.
//
//	tether agent register --name demo-agent -o json | jq -r .credential > agent.cred
//	tether grant root --holder <node> --scope tool:echo -o json | jq -r .token > agent.cap
//	go run ./examples/agent --credential-file agent.cred --capability-file agent.cap --tool http://127.0.0.1:8081/echo
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
	addr := flag.String("addr", "http://127.0.0.1:7420", "control plane address")
	credFile := flag.String("credential-file", "", "file with the agent's credential")
	capFile := flag.String("capability-file", "", "file with the agent's capability token")
	tool := flag.String("tool", "http://127.0.0.1:8081/echo", "tool URL")
	every := flag.Duration("every", time.Second, "time between tool calls")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	credential, capability := mustRead(*credFile), mustRead(*capFile)
	agent, err := agentsdk.Join(ctx, *addr, credential, nil)
	if err != nil {
		log.Fatalf("join: %v", err)
	}
	log.Printf("joined as %s", agent)
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
		req, _ := http.NewRequestWithContext(agent.Context(), http.MethodPost, *tool, strings.NewReader("hello"))
		req.Header.Set(agentsdk.CapabilityHeader, capability)
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
		fmt.Fprintln(os.Stderr, "both --credential-file and --capability-file are required")
		os.Exit(2)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
