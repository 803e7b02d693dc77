package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// logLevelFlag adds --log-level to the root command: the level of the library's
// log records that dlock prints on stderr.
func logLevelFlag(root *cobra.Command) {
	root.PersistentFlags().String("log-level", "warn", "level of the library's log messages printed on stderr: debug, info, warn or error")
}

// parseLevel reads a --log-level value.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, usagef("--log-level must be debug, info, warn or error; got %q", s)
}

// logger is the logger for cmd, at its --log-level, writing to w.
func logger(cmd *cobra.Command, w io.Writer) (*slog.Logger, error) {
	s, err := cmd.Flags().GetString("log-level")
	if err != nil {
		s = "warn" // a command without the root's flags (not reached)
	}
	level, err := parseLevel(s)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})), nil
}

// redisLogs routes go-redis's own logging (by default raw lines on stderr, such as
// "failed to dial after 5 attempts", printed before dlock's own error) to the
// logger at Debug. go-redis has one logger for the whole process.
var redisLogs struct {
	once sync.Once
	mu   sync.Mutex
	l    *slog.Logger
}

type redisLogger struct{}

func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	redisLogs.mu.Lock()
	l := redisLogs.l
	redisLogs.mu.Unlock()
	if l != nil {
		l.DebugContext(ctx, "go-redis: "+strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}

func setRedisLogger(l *slog.Logger) {
	redisLogs.mu.Lock()
	redisLogs.l = l
	redisLogs.mu.Unlock()
	redisLogs.once.Do(func() { redis.SetLogger(redisLogger{}) })
}
