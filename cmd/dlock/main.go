// Command dlock works with distributed locks from the shell: it starts a development
// server and runs a self-contained demonstration. Run "dlock --help" for the list of
// commands and "dlock <command> --help" for each one.
package main

import (
	"os"

	"github.com/dlockio/dlock/internal/runner"
)

func main() {
	runner.MaybeRunWatchdog() // dlock run's watchdog is dlock started again
	os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
