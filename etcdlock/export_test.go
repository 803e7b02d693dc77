package etcdlock

// SetReadersInTxn sets how many members a waiting reader's write reads, until the
// returned function restores it. Tests that call it do not run in parallel.
func SetReadersInTxn(n int64) (restore func()) {
	old := readersInTxn
	readersInTxn = n
	return func() { readersInTxn = old }
}
