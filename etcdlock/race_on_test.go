//go:build race

package etcdlock_test

// raceEnabled: the race detector slows the servers embedded in the test (etcd) and
// the clients about tenfold, so the many-waiters test queues fewer.
const raceEnabled = true
