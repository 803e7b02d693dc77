// Package pglock is the dlock backend for PostgreSQL (URL schemes postgres:// and
// postgresql://), on pgx v5 with a pgxpool connection pool.
//
//	postgres://user:password@db.example:5432/app?sslmode=verify-full&sslrootcert=/etc/ca.pem
//	postgres://user:password@127.0.0.1:5432/app?table=dlock_locks&ttl=10s
//
// Parameters: table (the lock table, default "dlock_locks", optionally
// schema-qualified as "schema.table"; lower-case letters, digits and "_"); every libpq
// connection parameter that pgx understands (host, port, sslmode, sslrootcert, sslcert,
// sslkey, sslpassword, connect_timeout, target_session_attrs, channel_binding, ...);
// pgx's own (default_query_exec_mode, statement_cache_capacity, ...) and pgxpool's
// (pool_max_conns, pool_min_conns, pool_max_conn_lifetime, ...); the server settings
// application_name, search_path, statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout, synchronous_commit and options; and the core's
// ttl, renew, drift, owner. Any other parameter is an error: pgx would send it to the
// server as a session setting, where a typo such as "sslmod=require" could go unnoticed
// or fail far from its cause, so Open rejects it instead. The PG* environment variables
// and ~/.pgpass apply as in libpq. Without sslmode, pgx uses "prefer", which falls back
// to plain text: say sslmode=verify-full for TLS you can rely on.
//
// # Schema
//
// Open creates the table and a sequence if they do not exist, in one transaction under
// a transaction-level advisory lock, so that many clients starting at once create them
// once, and a failure (such as missing privileges) leaves nothing behind:
//
//	CREATE SEQUENCE dlock_locks_token_seq AS bigint START WITH <server time in µs>;
//	CREATE TABLE dlock_locks (
//	    key           text COLLATE "C" PRIMARY KEY,
//	    owner         text NOT NULL,        -- holder (or waiter it is reserved for)
//	    token         bigint NOT NULL,      -- fencing token, from the sequence
//	    expires_at    timestamptz NOT NULL, -- server clock: now() + TTL
//	    reserved      boolean NOT NULL DEFAULT false,        -- free, kept for owner
//	    queue_owner   text[] NOT NULL DEFAULT '{}',          -- '{+}': places may exist
//	    queue_channel text[] NOT NULL DEFAULT '{}',          -- a place's client's channel
//	    queue_expires timestamptz[] NOT NULL DEFAULT '{}',   -- unused (earlier versions)
//	    value         bytea                 -- the holder's value, NULL for none
//	);
//
// and, for semaphores (see below), the permit table, in a transaction of its own
// under the same advisory lock:
//
//	CREATE TABLE dlock_locks_permits (
//	    key        text COLLATE "C" NOT NULL,
//	    owner      text NOT NULL,        -- the holder (or the waiter it is reserved for)
//	    token      bigint NOT NULL,      -- fencing token, from the sequence (0 if reserved)
//	    expires_at timestamptz NOT NULL, -- server clock: now() + TTL
//	    reserved   boolean NOT NULL DEFAULT false, -- handed to a waiter, not yet taken
//	    channel    text NOT NULL DEFAULT '',       -- that waiter's client's channel
//	    value      bytea,                -- the holder's value, NULL for none
//	    shared     boolean NOT NULL DEFAULT false, -- a reader's (read-write locks)
//	    PRIMARY KEY (key, owner)
//	);
//
// A table set made by a version before semaphores lacks it: Open creates it. A role
// that may not (no CREATE on the schema) still gets a working backend for mutexes;
// its semaphore attempts fail with an error matching driver.ErrUnsupported that
// names the missing table, until an administrator creates it (as above) and grants
// SELECT, INSERT, UPDATE and DELETE on it. A permit table made by a version before
// read-write locks lacks the shared column: Open adds it under the same advisory
// lock (ALTER TABLE ... ADD COLUMN IF NOT EXISTS shared boolean NOT NULL DEFAULT
// false, which changes only the catalog); a role that may not alter it gets
// neither semaphores nor read-write locks (an error matching
// driver.ErrUnsupported says what to run) until its owner does.
//
// A table made by a version before values lacks the value column: Open adds it, in
// the same transaction under the same advisory lock (ALTER TABLE ... ADD COLUMN IF
// NOT EXISTS value bytea, which changes only the catalog). Clients of the older
// version keep working on it, but they neither store values nor notify holder
// watches, and a grant one of them takes over from an expired holder of this
// version keeps showing that holder's value: upgrade them together.
//
// Each waiter's place in a key's queue is a row of its own in the same table, under
// the key key || chr(2) || <20-digit place number, drawn from the sequence>: no
// dlock key contains a control character, so these never meet a key's row, and the
// primary key index keeps a key's places together in line order. A place row's owner
// is the waiter, token its patience in µs, expires_at when it lapses (unless its
// client is alive, see below), queue_channel its client's channel. (Versions before
// this layout kept the queue in the arrays of the key's row; clients of both kinds
// on one table still exclude each other, but do not see each other's waiters, who
// then fall back to their retry timer: upgrade them together.)
//
// Privileges: creating them needs CREATE on the schema (or let an administrator run
// the statements above once); adding the value column needs ownership of the table
// (Open says so, and what to run, when it lacks it). Using them needs SELECT, INSERT,
// UPDATE and DELETE on the table (and on the permit table, for semaphores) and USAGE
// on the sequence; Open does not attempt DDL when both exist, and
// checks that an existing table has these columns. LISTEN and pg_notify need no
// privilege. The database should use the UTF8 encoding (keys are UTF-8 text). Never
// drop the sequence: it carries the fencing order. (If Open has to create it while the
// table exists, it starts above both the server time in microseconds and the largest
// token in the table, so tokens keep rising.) Nor give it a CACHE above 1, with which
// each session would draw from a block of its own: Open refuses such a sequence.
//
// # Algorithm
//
// A key has a row while it is held, reserved or waited for. Acquire first tries a
// plain INSERT ... ON CONFLICT DO NOTHING with a new token: a free key costs one
// insert. If a row exists, one statement reads it and decides in SQL: a live row of
// the caller's own is re-entered (same token, TTL extended) when the request says
// Reenter (driver.Request), and otherwise refused with nothing written (another
// process may use the same owner id); a row the lock is reserved for the caller, or
// an expired row with no live waiter queued ahead, is taken with a new token.
// Otherwise a caller that will wait takes its place at the end of the key's queue (a
// place row), locking the key's row and marking it (queue_owner). A waiter already
// queued skips the INSERT, and while its client is alive its later attempts only
// read: they write only to take the lock. So does a waiting Lock of a key its
// client handed to a waiter less than 20 ms before (the key was held and waited
// for a moment ago, so the INSERT would most likely be refused): it first runs a
// lighter statement that only adds its place at the end of the queue, when the
// key's row is a live grant of another owner id, not reserved and already marked
// (it locks the row as the full statement does, and commits the same way), and
// the full statement when the row is in any other state (free, expired, its
// own, unmarked).
// A token is drawn from the sequence once the row is the caller's, or checked
// then: an update draws it after locking (or compare-and-setting) the row. An
// INSERT computes its values before it reaches the unique index, where it may wait
// while another client takes and releases the key; a token drawn before that wait
// would be lower than that client's. So the full statement's insert is followed, in
// the same transaction and round trip, by an UPDATE that draws the token; the plain
// INSERT of a free key draws it in the insert, and is followed the same way by an
// UPDATE that draws it again unless it is still the sequence's last value
// (pg_sequence_last_value): if no draw came after it, none came while the insert
// waited, and every later grant of the key draws later. The uncontended Lock thus
// writes its row once. (The sequence orders draws, so a later grant of the key
// always draws later; the sequence must keep its default CACHE 1, so that draws
// are handed out in order.)
// Expiry is computed by the server, now() + TTL, so client clocks never matter.
// Refresh is an UPDATE of expires_at that compares the owner and the expiry. A
// refused attempt that will not wait writes nothing.
//
// Release first tries a plain DELETE of the caller's row, unmarked (no place queued).
// Otherwise it locks the row and, in a second statement of the same transaction
// (whose snapshot then holds every place added before the lock), hands the lock on:
// it grants the key to the first live place directly (driver.Waiter's direct
// handoff): the row becomes that waiter's grant, with a new token drawn from the
// sequence after the row lock, its expiry now() + the TTL its place recorded (on
// the server's clock), the place's value, and a handed mark naming the place; it
// deletes that place and the lapsed ones before it, and calls pg_notify on that
// waiter's client's channel with the token and the number of the attempt that
// wrote the place, inside the same transaction, so the wake-up is sent only if
// the release commits. The waiter's next attempt returns that grant without a
// statement, its Grant.Age counted from when that attempt was sent (the grant
// started after the place was written). A waiting attempt of the same place that
// finds the mark (its notification was lost) claims the grant as a re-entry
// would; a waiter that gives up passes a grant handed to its place on, as it does
// a reservation. (A place written by a client of an earlier version, which records
// no TTL, is only reserved for its patience, and the waiter's attempt takes it.)
// With no live place, it deletes the row. The first
// place is found through the primary key index: a handoff costs one write (the
// release) and one notification to one
// client, O(log N) whatever the number N of waiters; no one barges in ahead of the
// queue (waiting is FIFO), and an uncontended release sends no NOTIFY (which
// serialises committing transactions on a cluster-wide lock). Each Client keeps one
// dedicated connection that LISTENs on the client's own channel while it has waiters
// or holder watches (and for a minute after, then closes it).
//
// That connection also holds a session-level advisory lock (its key: the first 64
// bits of the channel's random part). A place whose client holds it is live whatever
// its expiry, so a queued waiter need not renew its place: its fallback retries (the
// core's guard against a lost wake-up) are reads. A place whose client is gone (the
// lock is free: a handoff's pg_try_advisory_xact_lock succeeds) lapses at its expiry,
// the patience given by the waiter's last write (4 to 7 seconds with the core's
// defaults); a waiter whose client's listening connection is down renews its place
// on each attempt meanwhile. A notification for a waiter the client no longer has (it
// gave up) passes the lock on at once.
//
// A waiter that gives up withdraws its place and passes a reservation made for it to
// the next waiter, including a place its last attempt's statement may still be
// creating: waiting attempts run to their end even when the caller gives up, and the
// withdrawal comes after. An attempt that is not a wait's (TryLock, or a Lock's first
// attempt on a key likely free) runs to its end too, for up to 5 s after its call
// gives up, and Acquire returns its outcome: cut short, pgx sends a cancel request
// and closes the connection, but a statement the server had not begun when the cancel
// came would run after it and could grant the key to a caller that had gone (a stable
// owner id's grant then stays for its TTL). A withdrawal that fails (the server is down or
// restarting) is tried again in the background, with pauses growing to a second,
// until it succeeds or the client closes: while the client listens, the place it
// left would stay live, first in line, and once the holder's lease lapsed without
// a release nobody could take the key. A reservation for a crashed waiter lapses
// after its patience, and the next waiter takes the lock when its own retry comes.
// A wake-up lost to a dropped connection is covered by waking every local waiter once
// the listening connection is back, and by the core's bounded fallback retry. A grant
// that expires rather than being released notifies no one: waiters retry when the
// holder's TTL runs out.
//
// Costs: an uncontended cycle is one INSERT and one DELETE, like the plainest table
// lock, and needs no listening connection: a Lock registers its wait before its
// first attempt only on a key this client found held in the last two seconds
// (WatchFirst), elsewhere only once that attempt is refused. A handoff is one write
// and one NOTIFY whatever the number of waiters (a holder handed the key with places
// behind it releases with the handoff statement at once, one round trip); the
// NOTIFY travels to one client only, but PostgreSQL (15) signals every listening
// session of the database to look at it, so each client that is waiting adds server
// work to every handoff. With 16 clients waiting on one key, that work was a third or
// more of the machine's CPU per handoff on a slow VM; the same 16 waiters in one or
// four clients spared it (BenchmarkHandoffCeiling, docs/benchmarks.md). A client
// listens only while it waits or watches, and for DefaultLinger after. Queueing is
// one write per waiter. Waiters' fallback retries are reads of the key's row and a
// few index entries (a refused attempt reports up to 8 places ahead,
// driver.HeldError.Ahead, and the core spaces the retries of a waiter further back
// further apart, 1 to 4 seconds by default), so thousands of waiters per key cost
// reads, not writes. LISTEN needs a session of its
// own: behind a transaction-pooling proxy (PgBouncer in transaction mode) wake-ups are
// lost, advisory locks do not hold, and waiters fall back to their retry timer.
//
// # Several keys at once
//
// dlock.Client.LockAll and TryLockAll (driver.MultiAcquirer) take a free set of
// keys in one transaction and one round trip: a first statement locks the rows of
// the set's keys that have one, in ascending key order (so two sets never deadlock
// in the server); a second decides on every key as an attempt that will not wait
// would (no live holder, no live reservation for a waiter, no live place queued,
// and no semaphore's or read-write key's state row) and, only if all are free,
// inserts or takes each key's row, each with its own token from the sequence, and
// notifies the keys' watches; a third gives the inserted rows their tokens. Nobody
// sees part of the set held. A key whose row another client inserts or locks
// between the statements fails the transaction, which then changes nothing, and
// the attempt runs again. A set that is not free is refused with nothing written
// (LockAll then takes the keys one by one, waiting in each key's queue); a
// semaphore's key in it is a limit mismatch, as for Lock, and a read-write key's
// is reported taken (LockAll then takes it as Lock would).
//
// # Values and holder watches
//
// The value of a grant (driver.Valuer: dlock.WithValue, an election's leader
// address) is the value column of the key's row, written by the statement that
// grants: the fast-path INSERT (which sends the column only when there is a value),
// or the UPDATE that takes a reserved or expired row or re-enters one. A release
// that hands the key to a waiter clears it (a reserved row has no holder), and the
// waiter's own attempt, which takes the reservation, writes the waiter's value: a
// queued place needs no copy of it. SetValue is one UPDATE that compares the owner
// and the expiry and leaves the expiry alone. The value is in the row of the grant,
// so it is exactly as durable as the grant.
// List (driver.Lister) reads the holders and values of every key under a prefix in one statement.
//
// A holder watch (driver.HolderWatcher, for dlock.Client.Observe) lives on the
// client's listening connection, the one its waiters use: while any key is watched
// that connection LISTENs on the table's watch channel, dlock_watch_<table oid>,
// and holds a session-level shared advisory lock on each watched key's hash
// (hashtextextended of the key, seeded with the table's oid). Every statement that
// grants, releases, hands off, force-releases or sets a value tries to take that
// lock exclusively for its transaction, and calls pg_notify on the watch channel
// with the key (at most 512 bytes, well within NOTIFY's 8000) only when it cannot,
// that is when some client watches the key. A try that succeeds keeps the lock to
// commit, and WatchHolder's lock waits for it, so WatchHolder returns only after
// every change that notified no one has committed: a read after it sees them, and
// nothing is missed. Each client dispatches the notifications to its watches of
// that key. Not notified: expiry (the core reads the holder again when the TTL runs
// out), Refresh (the holder stays), and changes made by clients of an earlier
// version. When the listening connection is lost, its locks go with it; once it is
// back, with LISTEN and the locks taken again, every watch receives once.
//
// Costs: a key no one watches costs its changes one advisory lock try each (a
// lock-table entry for the rest of the transaction, no extra round trip, no extra
// bytes) and no NOTIFY. That matters: the commit of a transaction that notifies
// takes a cluster-wide lock that is held through its WAL flush, so notifying on
// every change would serialise the commits of every uncontended lock and unlock.
// Measured on one server with fsync on, 8 clients cycling on 8 keys: 588 cycles/s
// without a notify, 552 with the try (within the noise), 148 with a NOTIFY on every
// change. A watched key costs one lock-table entry on each watching client's
// connection (the server has room for max_locks_per_transaction × max_connections
// in all) and a NOTIFY per change, which every client that watches any key of the
// table receives (and drops unless it watches that key). Starting a watch waits for
// a change of that key in flight to commit; while it does, the connection delivers
// no wake-ups to the client's waiters. Of two changes of one key in flight at once
// (contention), one fails its try and notifies with no one watching: spurious, and
// harmless. The advisory lock keys are 64-bit hashes in the database's one
// space of advisory locks; one that met an application's own lock would at worst
// send needless notifications or delay a watch's start.
//
// # Semaphores
//
// A lock call with a limit N > 1 (dlock.WithLimit; driver.Semaphorer) admits up to
// N holders of the key at once, each with its own permit: its own token from the
// sequence, expiry, renewal, release and value. The key's row in the lock table is
// then its state row: owner '#' (no owner id can be '#'), token the limit, and
// expires_at the latest expiry of its permits, kept so by every statement that
// grants, refreshes or frees one; no holder is named in it. The permits are rows of
// the permit table, keyed (key, owner). Waiters queue in place rows exactly as for a
// mutex, and wake on their client's channel.
//
// Every semaphore statement first locks the key's row, in the same transaction and
// round trip: an attempt inserts the state row if the key has no row, or locks the
// existing one (INSERT ... ON CONFLICT DO UPDATE ... WHERE false, which writes no
// new row version), then decides in one statement, whose snapshot holds every
// permit and place committed before the lock: a permit reserved for the caller is
// taken with a new token; the caller's own live permit is re-entered (Reenter) or
// refused; otherwise the caller is granted when the free permits (N less the other
// owners' live permits, held or reserved) outnumber the live places queued ahead of
// it, so no newcomer takes a permit a waiter ahead of it waits for. A refused
// waiting caller takes its place at the end of the queue. A release (also Refresh,
// a force release, a withdrawal) locks the row and frees the permit; the free
// permits are reserved at once for the first live places in line, as many as are
// free (a force release hands on several at once), each place's client notified
// in the same transaction; a waiter's next attempt takes its reservation with a
// new token, a waiter that gives up passes it on, and a crashed waiter's
// reservation lapses after its patience. When a key is left with no live permit and
// no live place, its state row, places and permit rows go.
//
// The limit is the key's while it has a live permit (held or reserved) or a live
// queued place: an attempt with another limit, a mutex's included (a mutex's
// attempt on a semaphore's key reads the state row, sees its limit, and reads
// whether it is live from expires_at and the places), fails with an error matching
// driver.ErrLimitMismatch and writes nothing; a semaphore attempt on a mutex's live
// key does the same. Once the key is neither held nor waited for, the next attempt
// of either kind takes it over with its own limit (the leftover permit rows of
// crashed holders are dropped then or at the next semaphore grant).
//
// Refresh, Release and SetValue are given no limit: each client remembers which of
// its grants are permits and goes to the permit table first for those and to the
// lock table first for the rest, trying the other table only when the first says
// the grant is not held. A mutex's calls are thus unchanged (no extra round trip, no
// extra bytes), and a permit taken by one client can be renewed or released by
// another with the same owner id, at the cost of one more round trip.
//
// Costs: a permit's grant, refresh and release are each one round trip of two
// statements that write the permit row and the key's state row: N holders of one
// key contend for that row's lock (their statements are serialised per key, each a
// few index lookups), keys do not contend with each other. Measured on one server
// with fsync on, an uncontended Lock+Release of a permit of 4 takes about what a
// mutex's does (both are two commits, dominated by their WAL flushes; see
// BenchmarkSemaphoreCycle). Unlike a mutex's, a
// queued semaphore waiter's fallback retry locks the state row (a row lock, no new
// row version). Inspect reports the oldest holder (the lowest token); Holders
// lists them all in one statement, and Queue (driver.Queuer) the live places in
// serving order, readers marked, values kept, in one statement. Clients of versions before semaphores see a
// semaphore's key as held by owner '#' until its expiry bound passes, and treat its
// waiters as their own: upgrade them together.
//
// # Read-write locks
//
// A shared lock call (dlock.WithShared; driver.Sharer) is a reader: readers of a
// key hold together, a writer (any call without it) alone. A key with readers, or
// with a reader queued, is kept like a semaphore's key of limit 1: a state row
// (owner '#', token 1) and a permit row per holder, readers' marked shared, each
// with its own token from the one sequence, expiry, renewal, release and value.
// Places carry their mode (reserved, on a place row, marks a reader's). A reader
// is granted when no writer's permit is live (held or reserved) and no live place
// is queued ahead of it; a writer when no permit is live and no place is ahead; so
// a reader never passes a queued writer. A release (force release, withdrawal)
// reserves the key, each place's client notified in the same transaction, for the
// leading run of reader places (a shared permit for each, all at once) once no
// writer's permit is left, or for the first place, a writer, once no permit is
// left; a writer that gives up its place lets in the readers queued behind it the
// same way. When the key is left with no permit and no place its rows go, and the next
// writer takes it as a plain mutex again.
//
// A writer on a free key, or on a key held by a writer with no reader about, is a
// plain mutex: its fast path is unchanged (no extra round trip, no extra bytes).
// A reader that finds a writer's mutex row turns it, in its attempt's transaction,
// into a state row of limit 1 and a writer's permit with the same token, expiry and
// value; that writer's next Refresh, Release or SetValue then costs one more round
// trip (the lock table first says not held). A writer's attempt on a read-write
// key reads the state row in its mutex statement, sees limit 1, and asks again as
// a holder of limit 1: two round trips, on read-write keys only. A reader's
// refresh costs what a semaphore permit's does, and a handoff costs a row per
// reader handed the key.
//
// Readers do not take turns: a reader's grant and release hold the key's readers'
// barrier, an advisory lock of the transaction, shared, lock no row, and write
// only the reader's own permit row (sql/read_lock.sql, read_acquire.sql,
// read_release.sql), so readers' transactions, their commits included, run in
// parallel, while a writer's attempt and every handoff and permit change of a
// read-write key, which take the barrier exclusively before they lock the key's
// row FOR UPDATE (lock_row.sql, sem_lock.sql; a mutex's release, which changes
// no state row, locks the row alone), wait for the readers in flight and they
// for it: each still decides on every permit and place committed before its
// lock. (A
// share lock of the row did the same, but each reader then joined a MultiXact
// that the next had to copy: see docs/lock-types.md.) A fast grant applies when
// the key is free (it inserts the state row) or is a read-write
// key with no writer's permit and no live place, and the state row's expiry bound
// already covers the new permit (a reader's full attempt sets the bound two TTLs
// ahead, so the bound may outlast the last reader by up to a TTL); otherwise the
// full attempt decides, one more round trip. Its token comes from the sequence like
// every grant's, drawn after the writer before it committed and before the writer
// after it takes the barrier, so tokens still rise per key across readers and writers.
// A reader's release frees the key, or hands it to a queued writer, in the same
// transaction when it sees no other reader left (or a place queued) and no other
// transaction holds or awaits the barrier (tried exclusively, then the row FOR
// UPDATE SKIP LOCKED). Else, with a place queued, it runs the handoff after
// committing (waiting for the readers in flight, in the background if its caller
// gives up first; of two last readers each sees the place, so a queued writer is
// always woken); with none
// it does nothing more, and the state row it may leave without permits is a free
// key to every statement (any attempt takes it; Holders, Inspect and List show no
// holder) until the key's next release or handoff that finds it alone drops it.
// Readers' notifications of holder
// watches do not take turns either: a reader that finds the watch lock held
// notifies only if a watch holds or awaits it, and a watch that takes its lock then
// waits for the readers in flight (a barrier lock each reader holds shared). A reader on a semaphore's key, and a
// semaphore on a read-write key, fail with an error matching
// driver.ErrLimitMismatch. Clients of versions before read-write locks see a
// read-write key as a semaphore of limit 1 and fail their mutex attempts on a live
// one with driver.ErrLimitMismatch: upgrade them together.
//
// # Dead rows
//
// Every grant, place and permit is a row that a release or handoff deletes, so a
// busy key leaves dead rows (and their index entries) behind until VACUUM, which
// autovacuum runs about once a minute at most. The statements look a key's rows up
// by index key prefix, and a plain index scan marks the dead entries it passes, so
// that later scans skip them and a page split drops them; a bitmap index scan
// marks none and reads them all again on every lookup. dlock's connections
// therefore run with enable_bitmapscan=off (a session setting sent at connection
// start; it changes only the plans of dlock's own statements). Measured: on a key
// whose readers had left about 8,000 dead permits, each permit lookup read 128
// index pages by bitmap scan, and 4 to 17 by plain index scan (1 to 14 live
// permits); 16 readers of one key made 1.7 times as many reads per second.
//
// # Plans
//
// Every statement is prepared once per connection (pgx's statement cache). By
// default the server plans the first five runs of a prepared statement for their
// parameters and then keeps doing so whenever the generic plan's estimate is the
// higher; planning the longer statements costs milliseconds of server CPU. With a
// permit table of many rows it kept planning a reader's release on every run, so a
// reader's transaction sets plan_cache_mode=force_generic_plan for its own
// statements (set_config, local to the transaction, in read_lock): their plans are
// made once per connection. Measured (pg_stat_statements and the server's CPU time,
// 16 readers of one key): server CPU per read 1.54-1.62 ms before and 1.24 ms
// after in runs of 3,000 reads (1.32-1.39 ms with the setting for the whole
// session); 1.05 and 0.99 ms in runs of 12,000. The setting
// is not used for the whole session: there it made the mutex's hot key slower (176-265
// against 260-336 acquisitions/s; why was not examined).
//
// # Safety model
//
// Mutual exclusion (at most N holders of a semaphore of N) holds on one PostgreSQL
// server (or a primary with synchronous replication, where failover promotes a
// standby that had every committed grant): the row (a permit's row, counted under
// the lock of its key's state row) is the lock, a grant is committed before it is reported, and expiry uses only the
// server's clock. The client's local validity deadline (TTL minus drift, from when the
// request was sent) ends before the server-side expiry, so a holder that cannot renew
// stops believing it holds the lock before anyone else can take it.
//
// Fencing tokens come from a sequence: strictly larger for every new grant of any key,
// never reused after a crash or restart, as long as commits are durable. Open refuses
// a session with synchronous_commit=off, where a crash could forget a grant and its
// token after the client was told about them. Only a waiting attempt that was
// refused commits asynchronously (set for its own transaction): it writes nothing
// but its place in the queue and the row's queued mark, which a crash may lose (the
// waiter queues again at its next attempt), and its commit then does not wait for a
// WAL flush while it holds the key's row lock, which the next handoff needs. Every
// grant's commit waits for the flush, which makes everything written before it
// durable too.
//
// The statements are written for read committed, PostgreSQL's default isolation:
// a statement that waited for a key's row lock reads the row as the holder
// committed it. Under repeatable read or serializable they fail with serialization
// errors (SQLSTATE 40001) whenever two clients meet on a key. Open's connections
// set default_transaction_isolation to read committed whatever the server's or
// role's default, and New refuses a pool whose sessions use another level.
//
// What is NOT promised: with fsync=off, an operating-system crash can lose grants and
// tokens; with asynchronous replication, a failover to a standby that had not received
// a grant lets a second holder in and may reissue tokens. A server whose clock jumps
// forward expires grants early. In those cases only fencing (the protected resource
// checking tokens) keeps you safe. Rows of crashed holders stay in the table until the
// key is taken again; deleting rows whose expires_at has passed never lets two holders
// in (it only drops the queue of waiters, who take new places on their next attempt).
package pglock

import (
	"context"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/permits"
	"github.com/dlockio/dlock/internal/recent"
)

// Scheme is the URL scheme of this backend, registered with package driver;
// SchemeAlias ("postgresql", which libpq accepts too) is registered as well.
const (
	Scheme      = "postgres"
	SchemeAlias = "postgresql"
)

func init() {
	for _, s := range []string{Scheme, SchemeAlias} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultTable is the default lock table.
const DefaultTable = "dlock_locks"

// DefaultLinger is how long a client keeps its listening connection after its last
// waiter stopped waiting and its last holder watch stopped.
const DefaultLinger = time.Minute

// Backend is the PostgreSQL backend. It implements driver.Backend, driver.Notifier,
// driver.WatchAdvisor, driver.Inspector, driver.ForceReleaser, driver.Valuer,
// driver.HolderWatcher, driver.Semaphorer, driver.Sharer and driver.Queuer, and is
// safe for concurrent use.
type Backend struct {
	config
	pool    *pgxpool.Pool
	own     bool // close pool in Close
	channel string
	closed  atomic.Bool
	lst     *listener

	sql statements

	// semErr says why semaphores cannot work (no usable permit table), or nil.
	semErr error
	// grants remembers the (key, owner) grants this client took as semaphore
	// permits, so that Refresh, Release and SetValue try the permit table first
	// for them (and the lock table first for every other).
	grants permits.Set
	// handedOn marks the mutex keys this client handed to a waiter lately (see
	// contended).
	handedOn *recent.Keys
	// heldLately marks the keys an attempt of this client found held lately (see
	// WatchFirst): in fixed space, since every refused TryLock marks its key.
	heldLately *recent.Slots
}

// heldFor is how long a key an attempt found held counts as contended for
// WatchFirst.
const heldFor = 2 * time.Second

// WatchFirst implements driver.WatchAdvisor: a waiting Lock registers its wait
// before its first attempt only on a key this client found held in the last two
// seconds (or a key that shares its slot in that record, see recent.Slots), or
// handed to a waiter lately. Elsewhere the key is most likely free, and
// its first attempt, without a place in the queue, is all an uncontended Lock costs:
// registering costs a wake-up of the listening goroutine, and another when the wait
// ends.
func (b *Backend) WatchFirst(key string) bool {
	return b.heldLately.Within(key) || b.handedOn.Within(key, time.Now())
}

// contendedFor is how long after this client handed a key on to a waiter its next
// waiting Lock of the key skips the plain INSERT, which would most likely be
// refused: the key was held and waited for a moment ago. (A variable for tests.)
var contendedFor = 20 * time.Millisecond

// contended reports whether this client handed key on to a waiter lately.
func (b *Backend) contended(key string) bool { return b.handedOn.Within(key, time.Now()) }

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.WatchAdvisor  = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
	_ driver.Lister        = (*Backend)(nil)
	_ driver.Queuer        = (*Backend)(nil)
)

// Shares implements driver.Sharer: the backend honours Request.Shared (read-write
// locks, kept in the permit table like a semaphore's permits). It fails a shared
// attempt with an error matching driver.ErrUnsupported when semaphores cannot work
// on this table set.
func (b *Backend) Shares() bool { return true }

// Pool returns the connection pool.
func (b *Backend) Pool() *pgxpool.Pool { return b.pool }

// Table returns the lock table's name as given ("table" or "schema.table").
func (b *Backend) Table() string { return b.tableName }

// Channel returns the LISTEN/NOTIFY channel on which this client's waiters are woken.
func (b *Backend) Channel() string { return b.channel }

// Watch implements driver.Notifier. The client's listening connection is opened (and
// LISTEN issued) by the first wait, and shared by every later one; Watch returns once
// it listens, so no wake-up after the caller's next attempt can be missed.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	w, err := b.lst.watch(ctx, b, key, owner)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	return w, nil
}

// Close implements driver.Backend: it closes the listening connection and, when the
// backend was made by Open, the pool. Grants still held stay until they expire.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.lst.close()
	if b.own {
		b.pool.Close()
	}
	return nil
}
