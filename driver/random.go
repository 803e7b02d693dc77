package driver

import (
	"crypto/rand"
	"encoding/hex"
)

// RandomHex returns n bytes from crypto/rand, hex-encoded (2n characters). The core
// makes owner ids with it (16 bytes: unguessable, and unique with overwhelming
// probability), and backends their channel names and the floor's lock values.
func RandomHex(n int) string {
	var buf [32]byte // no allocation but the string's for ids up to 32 bytes
	b := buf[:0]
	if n > len(buf) {
		b = make([]byte, 0, n)
	}
	b = b[:n]
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b)
}

// Holder names one owner's hold on one key: the map key backends use for their
// per-grant and per-waiter state.
type Holder struct{ Key, Owner string }
