// Package bench measures dlock backends side by side: the measuring loops shared by
// the Go benchmarks of package drivertest and by the "dlock bench" command, the
// statistics (percentiles, Jain's fairness index), a runner that interleaves
// backends in rounds, and the results as markdown, JSON and PNG charts.
//
// # What is measured
//
// For each backend, in every round:
//
//   - uncontended cycle: one client doing Lock+Release on one key (cycles/s, p50,
//     p99), paired cycle by cycle with the store's floor (internal/storeops: the
//     least a lock on that engine does, with the engine's own client), and the
//     ratio of their medians; with Config.Peers, the cycles of the store's peers
//     join the same loop, in turn;
//   - many keys: W workers, each with its own client (connection), on a random key
//     among K per acquisition (low contention), against the floor run by as many
//     clients on keys of their own;
//   - one hot key: W workers on one key: acquisitions/s, handoff latency (from a
//     Release call to the next holder's Lock returning), and fairness: acquisitions
//     of the least and most served worker and Jain's index;
//   - cost growth: N waiters queue behind a holder, the key passes down the chain,
//     and the server operations (the server's own counters, read
//     through internal/storeops) and driver calls per handoff are
//     counted: flat when a release wakes only the next waiter, growing with N when
//     it wakes them all.
//
// Rounds interleave the backends (round 1 runs every backend, then round 2, ...), so
// a change in machine load touches every backend alike, and the per-round ratios
// show how noisy the machine was. Ratios mean something within one run only.
//
// # Peers
//
// With Config.Peers, the lock libraries users run on the same stores (redsync with
// one pool and with one per Redlock master, bsm/redislock, etcd's concurrency.Mutex,
// go-zookeeper's Lock, pg_advisory_lock and a polled PostgreSQL row) run beside the
// backend of their store, on its servers, in the same rounds. Each peer is an
// Acquire adapter behind a pass-through driver.Backend, so the same loops measure
// it (cycle, many keys, hot key, with the same overlap check), and its uncontended
// cycles run in its dlock backend's own loop, cycle by cycle beside dlock's (a
// loop of its own could measure the same requests several times faster or slower
// on an idle machine: see docs/benchmarks.md); it has no floor,
// driver cycle, server counts or waiter chains. Every dlock backend then gets its
// ratio to the best peer of its store (BackendResult.VsPeers). See peers.go.
//
// # What is not promised
//
// Numbers depend on the machine, its load and the servers' settings: they are for
// comparing backends and configurations in one run, not for absolute claims. Server
// operations count what each engine counts (Redis commands, PostgreSQL writing
// transactions, ZooKeeper packets): compare their growth with the number of waiters,
// not their values across engines. Driver calls are counted in the client and are at
// least one round trip each on a network backend, except a Watch that reuses a
// connection's subscription.
//
// Every load is bounded in time (Config.Duration) or count (the waiter chains, each
// also bounded by ChainTimeout) and stops by itself; StartServers listens on
// 127.0.0.1 only.
package bench
