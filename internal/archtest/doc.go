// Package archtest holds the architecture test: the dependency rules that
// keep the layering one-way (cmd → controlplane → {supervisor, capability,
// the lease machine} → the store contract; agentsdk → {capability, proto};
// inside the supervisor, {rollout, stoprule} → the termination (package
// supervisor) → {ledger, privilege} → tree, and nothing there reaches
// controlplane; internal/ is the ground and imports no layer, and nothing
// outside cmd imports a command). It has no code of its own; the test lists the module's
// packages with `go list -json` and fails when a forbidden dependency
// appears.
package archtest
