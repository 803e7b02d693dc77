package etcdlock

// SetReadersInTxn sets how many members a waiting reader's write reads, until the
// returned function restores it.
func SetReadersInTxn(n int64) (restore func()) {
	old := readersInTxn.Swap(n)
	return func() { readersInTxn.Store(old) }
}
