// Package etcdstore is the replicated store backend: store.Store on an etcd
// cluster, for several control-plane replicas (docs/etcd.md). It honours the
// same contract as badgerstore, checked by storetest. Only the composition
// root (controlplane, cmd), the leader election and test harnesses import it.
package etcdstore
