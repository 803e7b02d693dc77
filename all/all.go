// Package all registers every dlock backend with dlock.Open. Import it for its side
// effect when the backend is chosen at run time (a CLI, a config file):
//
//	import _ "github.com/dlockio/dlock/all"
package all

import (
	_ "github.com/dlockio/dlock/etcdlock"  // etcd://
	_ "github.com/dlockio/dlock/memlock"   // mem://
	_ "github.com/dlockio/dlock/mysqllock" // mysql://, mariadb://
	_ "github.com/dlockio/dlock/pglock"    // postgres://, postgresql://
	_ "github.com/dlockio/dlock/redislock" // redis://, rediss://, unix://
	_ "github.com/dlockio/dlock/redlock"   // redlock://
	_ "github.com/dlockio/dlock/zklock"    // zk://
)
