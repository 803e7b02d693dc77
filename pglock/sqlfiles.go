package pglock

import (
	"embed"
	"fmt"
	"strings"
	"text/template"
)

// The statements live in sql/*.sql, one per file, each with a header (a template
// comment, not sent to the server) naming its parameters and result. The table name,
// the token sequence and the table's oid and watch channel are the only things put
// into them, each in one way: {{.Table}} is the table's identifier, validated
// (WithTable, identRE) and quoted (pgx.Identifier.Sanitize), {{.Seq}} the sequence's
// name and {{.WatchChannel}} the channel as quoted SQL literals, {{.TableID}} a
// number, {{.Permits}} the permit table's identifier (validated and quoted like
// the table's), {{.Key}} an SQL expression naming the key a fragment is about (a
// fixed string in the .sql files, see WithKey). acquire.sql has one variant with
// the row lock and one without ({{.Lock}}), fast_acquire.sql one with a value and one without ({{.Value}});
// hand_off.sql and sem_hand_off.sql take their condition ({{.Cond}}) from the fixed strings in
// loadStatements, never from input; lock_row.sql and stamp.sql have a variant for
// an array of keys ({{.Multi}}), for acquire_all.sql.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

var sqlTemplates = template.Must(template.New("").Option("missingkey=error").ParseFS(sqlFiles, "sql/*.sql"))

// sqlData is what the templates are given.
type sqlData struct {
	Table, Seq   string
	Permits      string // the permit table's identifier
	TableID      uint32
	WatchChannel string
	Lock, Value  bool
	Wake         bool
	Guard        bool // with Wake: only in a transaction read_release marked (read_wake)
	Cond         string
	Multi        bool   // the statement is about an array of keys, $1
	NoBarrier    bool   // lock_row: the row lock alone, for a mutex's handoff
	Key          string // the key's expression in fragment "notify"; "" for $1::text
}

// WithKey is d for fragment "notify" about the key that the SQL expression key
// names (a column of a row of several keys' statement) instead of $1.
func (d sqlData) WithKey(key string) sqlData {
	d.Key = key
	return d
}

// render runs the template of file name (in sql/) with d.
func render(name string, d sqlData) string {
	var b strings.Builder
	if err := sqlTemplates.ExecuteTemplate(&b, name+".sql", d); err != nil {
		panic(fmt.Sprintf("pglock: sql/%s.sql: %v", name, err)) // the files are embedded: a bug, found by any test
	}
	return strings.TrimSpace(b.String())
}

// loadStatements renders every statement for the lock table (oid tableID), its
// permit table and its sequence.
func loadStatements(table, permits, seq string, tableID uint32) statements {
	d := sqlData{Table: table, Permits: permits, Seq: literal(seq), TableID: tableID, WatchChannel: literal(watchChannel(tableID))}
	with := func(f func(*sqlData)) sqlData { c := d; f(&c); return c }
	handOff := func(cond string) string { return render("hand_off", with(func(c *sqlData) { c.Cond = cond })) }
	semHandOff := func(cond string) string { return render("sem_hand_off", with(func(c *sqlData) { c.Cond = cond })) }
	return statements{
		stamp: render("stamp", d),
		// AcquireAll: see acquire_all.sql.
		lockRows:   render("lock_row", with(func(c *sqlData) { c.Multi = true })),
		acquireAll: render("acquire_all", d),
		// Without the permit table (semaphores unsupported): no read-write keys.
		acquireAllMutex: render("acquire_all", with(func(c *sqlData) { c.Permits = "" })),
		stampAll:        render("stamp", with(func(c *sqlData) { c.Multi = true })),
		fastAcquire:     render("fast_acquire", d),
		restamp:         render("restamp", d),
		// With a value: the uncontended path without one sends no parameter for it.
		fastAcquireValue: render("fast_acquire", with(func(c *sqlData) { c.Value = true })),
		fastRelease:      render("fast_release", d),
		// A waiting attempt may write (its place), so it locks the row; an attempt
		// that will not wait reads the snapshot and writes only to take the lock.
		acquireWait: render("acquire", with(func(c *sqlData) { c.Lock = true })),
		acquireTry:  render("acquire", d),
		enqueue:     render("enqueue", d),
		refresh:     render("refresh", d),
		lockRow:     render("lock_row", d),
		// A mutex's release or force release changes only a mutex's row (its
		// conditions exclude a state row), which readers never take.
		lockMutexRow: render("lock_row", with(func(c *sqlData) { c.NoBarrier = true })),
		// Release: the caller's own grant, live or expired (no one else holds it then).
		release: handOff(`cur.owner = $2::text AND NOT cur.reserved`),
		// Force release: whoever holds it ($2 is '', no owner's place is dropped).
		forceRelease: handOff(`NOT cur.reserved AND cur.owner <> '#'`),
		// Withdraw a waiter ($1 key, $2 owner) that gives up: drop its place (withdrawPlace,
		// or every place of the owner's with withdrawOwner), then, if the free lock was
		// reserved for it, or granted to its place $3 by a direct handoff and not
		// claimed, hand it to the next live waiter or delete the row.
		withdrawPlace: render("withdraw_place", d),
		withdrawOwner: render("withdraw_owner", d),
		withdraw:      handOff(`cur.owner = $2::text AND (cur.reserved OR $3::text <> '' AND cur.queue_channel[2] IS NOT DISTINCT FROM $3::text)`),
		inspect:       render("inspect", d),
		setValue:      render("set_value", d),

		semLock:    render("sem_lock", d),
		semAcquire: render("sem_acquire", d),
		semRefresh: render("sem_refresh", d),
		// Release: the caller's held permit, live or expired.
		semRelease: semHandOff(`q.owner = $2::text AND NOT q.reserved`),
		// Force release: every live held permit.
		semForceRelease: semHandOff(`NOT q.reserved AND q.expires_at > now()`),
		// Withdraw: the permit reserved for a waiter that gives up.
		semWithdraw: semHandOff(`q.owner = $2::text AND q.reserved`),
		// After a withdrawal, on a read-write key: hand the key to whom it now admits.
		semWake:     render("sem_hand_off", with(func(c *sqlData) { c.Cond, c.Wake = "false", true })),
		semSetValue: render("sem_set_value", d),
		holders:     render("holders", d),
		list:        render("list", d),
		listMutex:   render("list", with(func(c *sqlData) { c.Permits = "" })),
		queue:       render("queue", d),
		readLock:    render("read_lock", d),
		readAcquire: render("read_acquire", d),
		readRelease: render("read_release", d),
		readLast:    render("read_last", d),
		readWake:    render("sem_hand_off", with(func(c *sqlData) { c.Cond, c.Wake, c.Guard = "false", true, true })),
	}
}
