// Command etcdmember serves one etcd member as a process of its own, configured by
// flags (see devserver.RunMember). The test-server launcher of the library's tests
// builds and starts it, so that those tests need no embedded etcd server and can
// kill, stop and restart members like any other server.
package main

import (
	"os"

	"github.com/dlockio/dlock/cmd/dlock/internal/devserver"
)

func main() { os.Exit(devserver.RunMember(os.Args[1:])) }
