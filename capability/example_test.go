package capability_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/tetherhq/tether/capability"
)

func ExampleCovers() {
	fmt.Println(capability.Covers("tool:*", "tool:shell"))
	fmt.Println(capability.Covers("tool:*", "tool:fs:*"))
	fmt.Println(capability.Covers("tool:shell", "tool:*"))
	fmt.Println(capability.Covers("s3:read:logs/*", "s3:read:logs/2026/03.gz"))
	fmt.Println(capability.Subset([]string{"tool:*"}, []string{"tool:shell", "s3:read:logs/x"}))
	// Output:
	// true
	// true
	// false
	// true
	// s3:read:logs/x false
}

func ExampleDelegate() {
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	root, _ := capability.NewRoot(capability.RootRequest{
		GrantID: "g_root", Issuer: "operator:alice", HolderNodeID: "planner",
		Scopes: []string{"tool:*"}, TTL: time.Hour,
	}, now)

	// The planner hands its worker a narrower grant.
	child, err := capability.Delegate(root, capability.DelegateRequest{
		GrantID: "g_worker", Issuer: "agent:planner", HolderNodeID: "worker",
		Scopes: []string{"tool:shell"}, TTL: 10 * time.Minute,
	}, []string{"planner"}, now)
	fmt.Println(child.Chain, child.Revokers, err)

	// The worker cannot widen what it was given.
	_, err = capability.Delegate(child, capability.DelegateRequest{
		GrantID: "g_helper", Issuer: "agent:worker", HolderNodeID: "helper",
		Scopes: []string{"tool:net"},
	}, []string{"planner", "worker"}, now)
	fmt.Println(errors.Is(err, capability.ErrScopeEscalation), err)
	// Output:
	// [g_root] [agent:planner operator:alice role:admin role:security] <nil>
	// true capability: scope escalation: scope "tool:net" is not covered by parent grant g_worker
}

func ExampleTombstoneSet_Revoked() {
	revokedAt := time.Date(2026, 3, 14, 9, 5, 0, 0, time.UTC)
	var set capability.TombstoneSet
	_ = set.Add(capability.Tombstone{
		Sequence: 1, GrantID: "g_planner", RevokedAt: revokedAt, DropAfter: capability.DropAfter(revokedAt),
	})
	// A token three levels down names its chain; one lookup per level.
	fmt.Println(set.Revoked("g_helper", []string{"g_root", "g_planner", "g_worker"}))
	fmt.Println(set.Revoked("g_other", []string{"g_root"}))
	// Output:
	// g_planner true
	//  false
}
