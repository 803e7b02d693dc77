// Package check runs dlock check: worker processes contend for locks through
// real servers (a setup), one fault is injected again and again, every operation
// is recorded on CLOCK_MONOTONIC, and the history goes to package checker.
//
// Each holder writes from its critical section, with its fencing token, to a
// resource (Config.Resource):
//
//   - ResourceStore, the checker's own store (Store): fenced, it refuses a token
//     lower than the highest it has accepted for the key; unfenced, it accepts
//     every write and logs what fencing would have refused.
//   - ResourcePostgres, ResourceRedis, ResourceEtcd: a real server of that kind,
//     started for the run and touched by no fault. Fenced, every write goes
//     through dlock's guard for the store (fence/pgfence, fence/redisfence,
//     fence/etcdfence); unfenced, it is the same write without the token check.
//     Each write appends (worker, lease, token, key) to a log inside the same
//     transaction, script or etcd transaction, and after the run the log is read
//     back in commit order, so that P3 counts what the resource itself committed,
//     not what a worker believed.
//
// A clean report means no violation that the recorded times prove (see package
// checker); a fenced real resource with P3 = 0 means its log holds no committed
// write with a token below one it had committed before on the same key.
package check
