// Command mcpserver is a small MCP server written with the Go SDK (tools
// echo, slow and fail; see internal/mcptest) to put behind the Tether MCP
// gateway: on stdio by default, or on Streamable HTTP with --http.
//
//	tether mcp wrap --name demo -- go run ./examples/mcpserver
//	go run ./examples/mcpserver --http 127.0.0.1:7431   # then: tether mcp serve --upstream-url demo=http://127.0.0.1:7431/mcp
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tetherhq/tether/internal/mcptest"
)

func main() {
	httpAddr := flag.String("http", "", "serve Streamable HTTP on this address (path /mcp) instead of stdio")
	events := flag.String("events", "", "write <id>.started and <id>.cancelled files for slow calls into this directory")
	flag.Parse()
	server := mcptest.NewServer(&mcptest.Events{Dir: *events})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *httpAddr == "" {
		if err := server.Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
			log.Fatal(err)
		}
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	srv := &http.Server{Addr: *httpAddr, Handler: mux}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
