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
//     ratio of their medians;
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
