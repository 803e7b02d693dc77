package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func init() { register(newVersionCommand) }

func newVersionCommand(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dlock's version, commit and Go version",
		Long: `Version prints the module version dlock was built from ("(devel)" for a build
from a checkout, or a pseudo-version), the commit, its time and whether the tree
had local changes (when the build recorded them), and the Go version and platform.
"dlock --version" prints the same.`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprint(e.stdout, versionText(debug.ReadBuildInfo()))
			return nil
		},
	}
}

// versionText describes the build from its build information (ok false when the
// binary carries none).
func versionText(bi *debug.BuildInfo, ok bool) string {
	var b strings.Builder
	if !ok {
		fmt.Fprintf(&b, "dlock (unknown version)\ngo: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	fmt.Fprintf(&b, "dlock %s\n", version)
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "commit: %s", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " (%s)", t)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(", with local changes")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
