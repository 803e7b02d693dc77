package pglock

import (
	"errors"
	"testing"

	"github.com/dlockio/dlock/driver"
)

// TestTableNames checks that a table name cannot be another table's relation: its
// token sequence (table_token_seq), its permit table (table_permits) or its primary
// key index (table_pkey).
func TestTableNames(t *testing.T) {
	for name, ok := range map[string]bool{
		"dlock_locks":           true,
		"app.locks":             true,
		"locks_token":           true,
		"locks_seq":             true,
		"locks_token_seq":       false,
		"app.locks_token_seq":   false,
		"locks_pkey":            false,
		"locks_permits":         false,
		"app.locks_permits":     false,
		"locks_permits_x":       true,
		"app.locks_pkey":        false,
		"locks_token_seq_x":     true,
		"locks_token_seq.locks": true,
	} {
		var c config
		err := WithTable(name)(&c)
		if ok && err != nil || !ok && !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("WithTable(%q) = %v", name, err)
		}
	}
}
