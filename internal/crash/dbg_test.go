package crash

import (
	"fmt"
	"os"
)

func init() {
	debugDump = func(h *harness) {
		f, _ := os.Create("/tmp/crash-history.txt")
		defer f.Close()
		for _, op := range h.leases.rec.history() {
			fmt.Fprintf(f, "%d-%d c%d %s\n", op.Call/1e6, op.Return/1e6, op.ClientId, LeaseModel().DescribeOperation(op.Input, op.Output))
		}
	}
}
