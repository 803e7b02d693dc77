// Package history is the record of one dlock check run: what every worker process
// did (operations with start and end times), what the fenced store accepted and
// rejected, and when faults were injected and healed. The runner writes it, the
// checker reads it, and the timeline draws it.
//
// Every time is nanoseconds of CLOCK_MONOTONIC, read by each process itself: on one
// Linux machine all processes share that clock, so times from different workers and
// from the store compare directly. A worker whose dlock client runs on a skewed
// (injected) clock still stamps its operations with the real CLOCK_MONOTONIC.
package history

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// Operation kinds.
const (
	// Acquire is one Lock call: OK with the grant's Token, or not OK with Err (the
	// worker's deadline passed, the backend failed, ...).
	Acquire = "acquire"
	// Renew is one Refresh the core sent to the backend for a lease (recorded by
	// wrapping the backend), OK when the server extended the grant. A successful
	// renewal sent at Start keeps the grant on the server until at least
	// Start + Meta.TTL.
	Renew = "renew"
	// Write is the critical section's write to the fenced store, as the worker saw
	// it (OK when the store answered; the store's verdict is in Writes).
	Write = "write"
	// Release is one Release call; OK when the backend confirmed it.
	Release = "release"
	// Lost is the moment the worker's lease ended without a release (Start == End):
	// the core declared it lost (refused renewal, validity deadline, session end).
	Lost = "lost"
)

// Op is one operation by one worker process on one key.
type Op struct {
	Process int    `json:"p"`  // worker number, from 1
	Key     string `json:"k"`  // lock key
	Kind    string `json:"op"` // Acquire, Renew, Write, Release or Lost
	Lease   int    `json:"l"`  // the worker's lease number (1, 2, ...): ties renewals, writes, releases to their acquire; 0 for a failed acquire
	Start   int64  `json:"s"`  // CLOCK_MONOTONIC ns when the call began
	// Attempt, for an OK Acquire, is when the last backend attempt of the Lock
	// call began (recorded by wrapping the backend): the server granted the key at
	// some moment in [Attempt, End]. For other ops it equals Start.
	Attempt int64  `json:"a"`
	End     int64  `json:"e"`             // CLOCK_MONOTONIC ns when it returned
	OK      bool   `json:"ok"`            // the call succeeded
	Token   uint64 `json:"tok,omitempty"` // the fencing token of the lease
	Err     string `json:"err,omitempty"` // why it failed
	// Held, for a failed Acquire, says that it failed because another owner held
	// the key (the error matched dlock.ErrLocked), not because the backend could
	// not be reached or answered otherwise. Recorded when Meta.HeldRecorded.
	Held bool `json:"held,omitempty"`
	// Shared, for an OK Acquire, says that the grant was a shared (read) hold of a
	// read-write lock (Meta.RW).
	Shared bool `json:"sh,omitempty"`
}

// StoreWrite is one write that reached the fenced store, in the order the store
// decided them; or, on a real resource (Meta.Resource), one write the resource
// committed (from its own log, read back after the run) or its guard refused, by
// Time.
type StoreWrite struct {
	Process  int    `json:"p"`
	Key      string `json:"k"`
	Lease    int    `json:"l"`
	Token    uint64 `json:"tok"`
	Time     int64  `json:"t"`   // CLOCK_MONOTONIC ns of the store's decision
	Accepted bool   `json:"acc"` // the store kept the write
	// Max is the highest token the store had accepted for Key before this write.
	// With fencing the store accepts a write only if Token >= Max; without
	// fencing it accepts every write, and an accepted write with Token < Max is a
	// resource safety violation (P3).
	Max uint64 `json:"max"`
}

// Event kinds.
const (
	Fault = "fault" // a fault was injected
	Heal  = "heal"  // the fault was healed (server back, process resumed, proxy restored)
	Note  = "note"  // anything else worth showing on the timeline
)

// Event is a fault injection, its healing, or a note, at one moment.
type Event struct {
	Time   int64  `json:"t"`
	Kind   string `json:"kind"`             // Fault, Heal or Note
	Fault  string `json:"fault,omitempty"`  // the fault's name (see Meta.Fault)
	Target string `json:"target,omitempty"` // what it hit: "redis", "worker 3", "etcd m1", ...
	Detail string `json:"detail,omitempty"`
}

// Meta describes the run.
type Meta struct {
	Backend string `json:"backend"` // backend name and setup, e.g. "redis (appendonly no)"
	// Hold is what the backend promises about expiry: a grant or renewal whose
	// attempt began at t keeps the key on the server until at least t + Hold
	// unless it is released (TTL for Redis, Redlock and PostgreSQL; less for
	// etcd and ZooKeeper, whose session keep-alives are not in the history).
	Hold   time.Duration `json:"hold"`
	URL    string        `json:"url"`    // the backend URL with secrets redacted
	Fault  string        `json:"fault"`  // the fault schedule's name, "none" for none
	Fenced bool          `json:"fenced"` // the store checked tokens (a real resource: writes went through its guard)
	// Resource is what the workers wrote to: "store" (the checker's own store;
	// also when empty, in histories written before resources existed), or a
	// real resource's name and address, whose own log after the run gave Writes.
	Resource string        `json:"resource,omitempty"`
	TTL      time.Duration `json:"ttl"`      // the lock TTL every worker used
	Workers  int           `json:"workers"`  // worker processes
	Keys     int           `json:"keys"`     // distinct keys
	Seed     int64         `json:"seed"`     // the random seed of the schedule
	Start    int64         `json:"start"`    // CLOCK_MONOTONIC ns when the workload began
	End      int64         `json:"end"`      // CLOCK_MONOTONIC ns when it ended
	Expected string        `json:"expected"` // "safe", or why the cell is expected to be unsafe
	// HeldRecorded says that failed acquires carry Op.Held. Histories written
	// before that field existed lack it; readers then tell "held" failures from
	// the error text.
	HeldRecorded bool `json:"held_recorded,omitempty"`
	// Limit is how many holders each key admitted (a semaphore workload); 0 or 1
	// for a lock.
	Limit int `json:"limit,omitempty"`
	// RW: the keys were read-write locks; an OK Acquire's Shared tells readers,
	// who hold together and do not write, from writers, who hold alone.
	RW bool `json:"rw,omitempty"`
}

// History is one run.
type History struct {
	Meta   Meta         `json:"meta"`
	Ops    []Op         `json:"ops"`
	Writes []StoreWrite `json:"writes"`
	Events []Event      `json:"events"`
}

// Write encodes h as JSON to w.
func (h *History) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	return enc.Encode(h)
}

// Save writes h as JSON to the file path.
func (h *History) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := h.Write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Load reads a history written by Save.
func Load(path string) (*History, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var h History
	if err := json.NewDecoder(f).Decode(&h); err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	return &h, nil
}
