package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// clientsEnv, set in a process's environment, makes it a client process of
// a measurement (ServeClients) instead of a bench run: the figures that say
// what the server costs then do not count its clients' CPU, scheduler and
// garbage collector, which on a 2-core machine are a third of a process
// that holds both.
const clientsEnv = "TETHER_BENCH_CLIENTS"

// clientJob is what a client process is asked to do: one client per
// credential, each on its own connection, calling op in a loop against its
// own parent node for Duration (a warm-up before it, as Throughput's).
type clientJob struct {
	URL         string        `json:"url"`
	Op          string        `json:"op"` // "spawn" or "get-node"
	HTTP1       bool          `json:"http1"`
	Credentials []string      `json:"credentials"`
	Parents     []string      `json:"parents"`
	Duration    time.Duration `json:"duration"`
}

// clientResult is a client process's answer: the measured rate, and how
// many calls completed in the whole run, warm-up included (the count the
// server's CPU time of the same span is divided by).
type clientResult struct {
	Rate  float64 `json:"rate"`
	Calls int64   `json:"calls"`
	Err   string  `json:"err,omitempty"`
}

// ServeClients runs the client side of a measurement when this process was
// started as a client process (clientsEnv set): it reads a job from stdin,
// runs it, writes the result to stdout and reports true. Otherwise it does
// nothing and reports false. tether-bench calls it first thing.
func ServeClients() bool {
	if os.Getenv(clientsEnv) == "" {
		return false
	}
	var job clientJob
	var res clientResult
	if err := json.NewDecoder(os.Stdin).Decode(&job); err != nil {
		res.Err = "read the job: " + err.Error()
	} else {
		rate, calls, err := runClientJob(context.Background(), job)
		res.Rate, res.Calls = rate, calls
		if err != nil {
			res.Err = err.Error()
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return true
}

func runClientJob(ctx context.Context, job clientJob) (float64, int64, error) {
	if len(job.Credentials) != len(job.Parents) || len(job.Credentials) == 0 {
		return 0, 0, errors.New("a job needs one parent per credential")
	}
	clients := make([]*agentsdk.Conn, len(job.Credentials))
	for i, cred := range job.Credentials {
		if job.HTTP1 {
			clients[i] = http1Dial(job.URL)(cred)
		} else {
			clients[i] = agentsdk.Dial(job.URL, cred)
		}
	}
	var op func(ctx context.Context, w int) error
	switch job.Op {
	case "spawn":
		op = func(ctx context.Context, w int) error { return spawnOnce(ctx, clients[w], job.Parents[w]) }
	case "get-node":
		op = func(ctx context.Context, w int) error { return readOwnNode(ctx, clients[w], job.Parents[w]) }
	default:
		return 0, 0, fmt.Errorf("unknown op %q", job.Op)
	}
	var calls atomic.Int64
	rate, err := Throughput(ctx, len(clients), job.Duration, func(ctx context.Context, w int) error {
		err := op(ctx, w)
		if err == nil {
			calls.Add(1)
		}
		return err
	})
	return rate, calls.Load(), err
}

// spawnOnce spawns one child under parent and checks it got a credential.
func spawnOnce(ctx context.Context, c *agentsdk.Conn, parent string) error {
	resp, err := c.Agent.Spawn(ctx, connect.NewRequest(&tetherv1.SpawnRequest{ParentNodeId: parent, Name: "agent"}))
	if err != nil {
		return err
	}
	if resp.Msg.Credential == "" {
		return fmt.Errorf("spawn of %s returned no credential", resp.Msg.Node.NodeId)
	}
	return nil
}

// readOwnNode reads node with GetNode and checks it is the one asked for.
func readOwnNode(ctx context.Context, c *agentsdk.Conn, node string) error {
	resp, err := c.Agent.GetNode(ctx, connect.NewRequest(&tetherv1.GetNodeRequest{NodeId: node}))
	if err != nil {
		return err
	}
	if resp.Msg.Node.GetNodeId() != node {
		return fmt.Errorf("GetNode of %s returned %s", node, resp.Msg.Node.GetNodeId())
	}
	return nil
}

// apartRun is a measurement whose clients ran in a process of their own.
type apartRun struct {
	clientResult
	// Server is this process's CPU time over the client process's life
	// (the server's, when nothing else runs in it), Clients the client
	// process's.
	Server, Clients time.Duration
}

// runClientsApart runs job in a client process (this executable, started
// with clientsEnv) and returns its result with the CPU time both sides
// used while it ran.
func runClientsApart(ctx context.Context, job clientJob) (apartRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return apartRun{}, err
	}
	in, err := json.Marshal(job)
	if err != nil {
		return apartRun{}, err
	}
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), clientsEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &stderr
	before, ok := processCPU()
	if !ok {
		return apartRun{}, errors.New("cannot read this process's CPU time")
	}
	if err := cmd.Run(); err != nil {
		return apartRun{}, fmt.Errorf("client process: %v: %s", err, tail(stderr.Bytes()))
	}
	after, _ := processCPU()
	var run apartRun
	if err := json.Unmarshal(out.Bytes(), &run.clientResult); err != nil {
		return apartRun{}, fmt.Errorf("client process answered %q: %v (stderr: %s)", tail(out.Bytes()), err, tail(stderr.Bytes()))
	}
	if run.Err != "" {
		return apartRun{}, fmt.Errorf("client process: %s", run.Err)
	}
	run.Server = after - before
	run.Clients = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return run, nil
}

// tail is the end of a process's output, for an error message.
func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// measureApart measures op from clients in a process of their own (one
// per credential, against its own parent), and reports the rate, the
// server's CPU time per call (this process's) and the clients'.
func measureApart(ctx context.Context, r *Report, name string, job clientJob) error {
	job.Duration = r.Duration
	run, err := runClientsApart(ctx, job)
	if err != nil {
		return err
	}
	unit := "agents/s"
	if job.Op != "spawn" {
		unit = "calls/s"
	}
	r.Add(name, run.Rate, unit)
	if run.Calls > 0 && run.Server > 0 {
		// The whole run, warm-up included, over the CPU time of it.
		r.Add(name+"/server-cpu-per-call", float64(run.Server.Microseconds())/float64(run.Calls), "µs")
		r.Add(name+"/clients-cpu-per-call", float64(run.Clients.Microseconds())/float64(run.Calls), "µs")
	}
	return nil
}
