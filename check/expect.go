package check

// Expectation is what a cell of the matrix should show, from what each backend
// promises (its package documentation) and what fencing adds.
type Expectation struct {
	// LockSafe: no grant while an earlier one could not have expired (P1 = 0).
	LockSafe bool
	// ResourceSafe: no stale write accepted by the store (P3 = 0). Always true
	// with fencing: the store refuses older tokens.
	ResourceSafe bool
	// Why explains an unsafe expectation, in one sentence.
	Why string
}

// Expect returns the expectation of one cell.
func Expect(setupName, faultName string, fenced bool) Expectation {
	e := Expectation{LockSafe: true, ResourceSafe: true}
	switch {
	case setupName == "redis" && faultName == FaultKill:
		e.LockSafe, e.Why = false, "a restart without persistence loses every lock key, so a second client gets a lock the first still holds"
	case setupName == "redis-async" && faultName == FaultFailover:
		e.LockSafe, e.Why = false, "a lock written to the master but not yet replicated is gone after the promotion (a narrow window: may not show in a short run)"
	case setupName == "redlock" && faultName == FaultDrop:
		e.LockSafe, e.Why = false, "a node that forgets a key early can give a second client its majority when the first holder had only a bare majority (rare on one machine, where holders get all nodes)"
	case faultName == FaultPause || faultName == FaultPauseAfterCheck:
		e.Why = "a holder paused past its TTL wakes up believing it still holds the lock and writes; no timeout can prevent that"
	case faultName == FaultClock:
		e.Why = "a client clock that jumps back makes the client believe its lease is valid after the server expired it"
	}
	if !e.LockSafe || e.Why != "" {
		e.ResourceSafe = fenced
	}
	return e
}

// Expected is Expect as one phrase, for the history and the reports.
func Expected(setupName, faultName string, fenced bool) string {
	e := Expect(setupName, faultName, fenced)
	switch {
	case e.LockSafe && e.ResourceSafe && e.Why == "":
		return "safe"
	case e.ResourceSafe:
		return "lock may be violated, the fenced store stays safe: " + e.Why
	}
	return "unsafe without fencing: " + e.Why
}
