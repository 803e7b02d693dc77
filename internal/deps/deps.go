//go:build tools

// Package deps pins the modules that backends under construction will import, so
// that go mod tidy keeps them meanwhile. It is never built.
package deps

import (
	_ "github.com/go-zookeeper/zk"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/spf13/cobra"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.etcd.io/etcd/server/v3/embed"
)
