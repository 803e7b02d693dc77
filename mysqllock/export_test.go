package mysqllock

// ListenerIDs returns the connection ids of the client's listening connection and
// of its anchor (0, 0 when no listener runs).
func ListenerIDs(b *Backend) (listener, anchor uint64) {
	b.lst.mu.Lock()
	defer b.lst.mu.Unlock()
	if b.lst.id == 0 {
		return 0, 0
	}
	return b.lst.id, b.lst.anchorID
}

// SetAfterWaitState makes f run in a mutex waiter's Stop between reading its wait
// state and handing on a grant handed to its place, until the returned func runs.
func SetAfterWaitState(f func()) (reset func()) {
	afterWaitState.Store(&f)
	return func() { afterWaitState.Store(nil) }
}

// Batched reports whether b sends short grants as one request (see quickBatch).
func Batched(b *Backend) bool { return b.batch != nil && !b.batchOff.Load() }
