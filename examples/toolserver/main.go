// Command toolserver serves one tool, "echo", behind an agentsdk.ToolGate:
// every call is verified and recorded by the control plane, and a cancel
// order from a termination cancels the handler's context; the gate
// acknowledges the cancel once the handler stopped without answering (one
// that writes its answer is recorded completed). The gate reports with
// its own tool-server token, never an agent's credential: a call's end and
// its cancel acknowledgement are evidence the agent must not be able to
// write.
//
//	tether token create --tool-server echo-gate > tool.token
//	go run ./examples/toolserver --token-file tool.token --listen 127.0.0.1:8081
package main

import (
	"context"
	"flag"
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
	tokenFile := flag.String("token-file", "", "file with this tool server's token (tether token create --tool-server NAME)")
	listen := flag.String("listen", "127.0.0.1:8081", "address to serve the tool on")
	gateID := flag.String("gate-id", "echo-gate", "the gate's name in the tool-call ledger: the tool server's name in its token")
	flag.Parse()

	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatalf("token: %v", err)
	}
	gate := agentsdk.NewToolGate(agentsdk.Dial(*addr, strings.TrimSpace(string(token))), *gateID)
	defer gate.Close()

	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		select {
		case <-time.After(200 * time.Millisecond): // the tool's "work"
			_, _ = w.Write(append([]byte("echo: "), body...))
		case <-r.Context().Done():
			// Cancelled by the control plane: stop, and let the gate ack.
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /echo", gate.Middleware("echo", echo))
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("tool \"echo\" on http://%s/echo, gate %q", *listen, *gateID)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
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
