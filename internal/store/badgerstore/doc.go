// Package badgerstore is the embedded store backend: store.Store on Badger,
// with the group committer that shares one durable sync between concurrent
// Updates (see the store package's doc for the contract it honours and
// storetest for the suite that checks it). Only the composition root
// (controlplane, cmd) and test harnesses import it.
package badgerstore
