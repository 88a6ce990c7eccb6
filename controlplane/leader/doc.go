// Package leader decides which control-plane replica runs the components
// that must run once per cluster: the termination reconciler, the lease
// expiry scanner, the record outbox, the capability marker and pruner.
//
// An Elector runs a function while its replica leads and cancels it when
// leadership is lost. Two electors exist:
//
//   - Always: the replica always leads. For the embedded Badger store,
//     where there is exactly one replica.
//   - Etcd: an election through etcd (concurrency.Election) on a session
//     lease. A replica leads from the moment its campaign wins until it
//     resigns, its session lease expires (it stopped renewing it for the
//     lease's TTL: crashed, hung or cut off), its election key disappears,
//     or the etcd member it talks to loses its own leader.
//
// Replicas that are not the leader can learn which one is (Observer,
// implemented by Etcd): each candidate publishes its Identity and Address
// (the URL the others reach it at) as its election value, and Observe
// reports the current leader at every change, so that work only the leader
// can do — the job leases, which live in its memory — is forwarded to it.
//
// Caller duties. Leadership is a lease, not a lock: between the moment etcd
// expires a silent leader's session and the moment that leader notices
// (at most one keepalive round trip later, when it is alive at all), two
// replicas can believe they lead. So leader-only components must stay
// correct with an overlapping predecessor: they write through store
// transactions that re-read the state they change (a termination moves one
// step only from the phase it read; a record is written only if absent),
// which the store serializes, and their effects outside the store (record
// sinks, webhooks) must be idempotent; a component that keeps state in
// memory and writes it blindly must fence off its predecessor itself (the
// lease coordinator's terms). Each component must also be
// restartable: a replica that loses and regains leadership runs it again,
// and it must rebuild what it keeps in memory from the store.
package leader
