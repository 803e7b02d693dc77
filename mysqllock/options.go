package mysqllock

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// Option configures a Backend (Open, New). An option with a bad value returns an
// error matching driver.ErrInvalid.
type Option func(*config) error

type config struct {
	table string // as given, a plain identifier
}

// queueSuffix names a table's queue table: table_queue.
const queueSuffix = "_queue"

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// WithTable sets the lock table: lower-case letters, digits and underscores,
// starting with a letter or underscore, at most 58 bytes, not ending in "_queue" or "_sem", in the URL's database.
// Clients that should contend for the same locks must use the same table; clients
// with different tables never meet.
func WithTable(name string) Option {
	return func(c *config) error {
		if !identRE.MatchString(name) || len(name) > 58 {
			return fmt.Errorf("%w: table %q must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 58 bytes)", driver.ErrInvalid, name)
		}
		if strings.HasSuffix(name, queueSuffix) {
			return fmt.Errorf("%w: table %q ends in %q, which names the queue of table %q", driver.ErrInvalid, name, queueSuffix, strings.TrimSuffix(name, queueSuffix))
		}
		if strings.HasSuffix(name, permitSuffix) {
			return fmt.Errorf("%w: table %q ends in %q, which names the permit table of table %q", driver.ErrInvalid, name, permitSuffix, strings.TrimSuffix(name, permitSuffix))
		}
		c.table = name
		return nil
	}
}
