// Package errline turns an error into the one line the dlock command prints.
//
// Errors from the library and its client libraries may span lines (errors.Join,
// pgx's per-address errors), repeat a part (the same dial error for each attempt),
// or carry "dlock: " at more than one level of wrapping. The command prints every
// message through Line, so that each is one line that says each thing once.
package errline

import "strings"

// Prefix starts every message of the command and every error of the library.
const Prefix = "dlock: "

// Line is msg as one line without the "dlock: " prefix: its lines are joined with
// "; " (or a space after a line that ends in ":"), parts that repeat an earlier
// one are dropped, and "dlock: " is removed where a wrapped error repeats it.
func Line(msg string) string {
	var b strings.Builder
	seen := map[string]bool{}
	for part := range strings.SplitSeq(msg, "\n") {
		part = strings.TrimSpace(strings.ReplaceAll(part, "\r", ""))
		if part == "" || seen[part] {
			continue
		}
		seen[part] = true
		if b.Len() > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(part)
	}
	s := b.String()
	for strings.HasPrefix(s, Prefix) {
		s = strings.TrimPrefix(s, Prefix)
	}
	for _, sep := range []string{": ", "; ", "("} {
		for strings.Contains(s, sep+Prefix) {
			s = strings.ReplaceAll(s, sep+Prefix, sep)
		}
	}
	return s
}

// Message is the printed form of msg: "dlock: " and Line(msg).
func Message(msg string) string { return Prefix + Line(msg) }
