package agentsdk_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/tetherhq/tether/agentsdk"
)

func TestFenceRejectsOlderGenerations(t *testing.T) {
	var f agentsdk.Fence
	for _, step := range []struct {
		job  string
		gen  uint64
		pass bool
	}{
		{"job-1", 7, true},
		{"job-1", 7, true}, // the same holder again
		{"job-1", 8, true}, // reassigned
		{"job-1", 7, false},
		{"job-2", 1, true}, // jobs are independent
		{"job-1", 9, true},
		{"job-1", 8, false},
	} {
		err := f.Admit(step.job, step.gen)
		if step.pass != (err == nil) || (!step.pass && !errors.Is(err, agentsdk.ErrFenced)) {
			t.Fatalf("admit %s gen %d: %v, want pass=%v", step.job, step.gen, err, step.pass)
		}
	}
	if f.Highest("job-1") != 9 || f.Highest("job-3") != 0 {
		t.Fatalf("highest: %d, %d", f.Highest("job-1"), f.Highest("job-3"))
	}
	if err := f.Admit("job-1", 0); err == nil {
		t.Fatal("generation 0 admitted")
	}
}

func TestFenceIsSafeForConcurrentUse(t *testing.T) {
	var f agentsdk.Fence
	var wg sync.WaitGroup
	for g := uint64(1); g <= 50; g++ {
		wg.Go(func() { _ = f.Admit("job", g) })
	}
	wg.Wait()
	if f.Highest("job") != 50 {
		t.Fatalf("highest %d", f.Highest("job"))
	}
	if err := f.Admit("job", 49); !errors.Is(err, agentsdk.ErrFenced) {
		t.Fatalf("after 50, 49: %v", err)
	}
}

func TestFenceMiddleware(t *testing.T) {
	var f agentsdk.Fence
	calls := 0
	h := f.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls++ }))
	do := func(job, gen string) int {
		r := httptest.NewRequest(http.MethodPost, "/tool", nil)
		if job != "" {
			r.Header.Set(agentsdk.HeaderJobID, job)
		}
		if gen != "" {
			r.Header.Set(agentsdk.HeaderLeaseGeneration, gen)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, c := range []struct {
		job, gen string
		code     int
	}{
		{"job", "2", http.StatusOK},
		{"job", "1", http.StatusConflict},
		{"job", "", http.StatusBadRequest},
		{"", "3", http.StatusBadRequest},
		{"job", "x", http.StatusBadRequest},
		{"job", "3", http.StatusOK},
	} {
		if got := do(c.job, c.gen); got != c.code {
			t.Fatalf("job %q gen %q: %d, want %d", c.job, c.gen, got, c.code)
		}
	}
	if calls != 2 {
		t.Fatalf("the tool ran %d times, want 2", calls)
	}
}

// A tool server fences side effects: once generation 8 of a job has
// written, a worker still believing it holds generation 7 cannot.
func ExampleFence() {
	var fence agentsdk.Fence
	write := func(job string, generation uint64) {
		if err := fence.Admit(job, generation); err != nil {
			fmt.Println("refused:", err)
			return
		}
		fmt.Printf("wrote for %s generation %d\n", job, generation)
	}
	write("job-42", 7)
	write("job-42", 8)
	write("job-42", 7)
	// Output:
	// wrote for job-42 generation 7
	// wrote for job-42 generation 8
	// refused: agentsdk: fenced: a newer lease generation exists for the job: job "job-42" generation 7 is older than generation 8
}
