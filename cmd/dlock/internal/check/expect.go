package check

// Expectation is what a cell of the matrix should show, from what each backend
// promises (its package documentation) and what fencing adds.
type Expectation struct {
	// LockSafe: no grant while an earlier one could not have expired (P1 = 0).
	LockSafe bool
	// ResourceSafe: no stale write accepted by the store (P3 = 0). Always true
	// with fencing: the store refuses older tokens.
	ResourceSafe bool
	// TokenSafe: tokens grow with real time (P4 = 0). True for every cell today;
	// kept so that a backend whose tokens can go back says so.
	TokenSafe bool
	// Why explains an unsafe expectation, in one sentence.
	Why string
}

// Expect returns the expectation of one cell.
func Expect(setupName, faultName string, fenced bool) Expectation {
	e := Expectation{LockSafe: true, ResourceSafe: true, TokenSafe: true}
	switch {
	case setupName == "redis" && faultName == FaultKill:
		e.LockSafe, e.Why = false, "a restart without persistence loses every lock key, so a second client gets a lock the first still holds"
	case (setupName == "redis-async" || setupName == "sentinel-async" || setupName == "cluster-async") && faultName == FaultFailover:
		// The token counter is replicated as late as the lock, but every token is
		// max(counter+1, server clock): the promoted replica's tokens are above
		// those the dead master issued, so P4 stays 0 and fencing holds.
		e.LockSafe, e.Why = false, "a lock written to the master but not yet replicated is gone after the promotion: a second client gets the lock the first still holds (with a higher token, so fencing holds)"
	case setupName == "redlock" && faultName == FaultDrop:
		e.LockSafe, e.Why = false, "a holder that reached only a bare majority (3 of 5 nodes) loses it when one of its nodes forgets the key early (a clock jump): a second client gets that node and the 2 others, a majority, while the first still holds"
	case faultName == FaultPauseAfterCheck:
		e.Why = "a holder paused past its TTL wakes up believing it still holds the lock and writes; no timeout can prevent that"
	case faultName == FaultPause:
		e.Why = "a holder paused past its TTL writes after it wakes up if the pause fell between its lease check and its write; elsewhere its core notices the expiry first (a random pause rarely shows)"
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
