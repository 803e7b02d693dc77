// Command dlock works with distributed locks from the shell: it starts a development
// server and runs a self-contained demonstration. Run "dlock --help" for the list of
// commands and "dlock <command> --help" for each one.
package main

import (
	"os"

	"github.com/dlockio/dlock/cmd/dlock/internal/devserver"
	"github.com/dlockio/dlock/cmd/dlock/internal/runner"
	"github.com/dlockio/dlock/internal/testserver"
)

func main() {
	runner.MaybeRunWatchdog()  // dlock run's watchdog is dlock started again
	devserver.MaybeRunMember() // so is each etcd member that bench and check start
	if os.Getenv(testserver.EtcdMemberEnv) == "" {
		if self, err := os.Executable(); err == nil {
			_ = os.Setenv(testserver.EtcdMemberEnv, self)
		}
	}
	os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
