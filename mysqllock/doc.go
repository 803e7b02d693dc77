// Package mysqllock is the dlock backend for MySQL and MariaDB (URL schemes mysql://
// and mariadb://), on database/sql with the go-sql-driver/mysql driver.
//
//	mysql://user:password@127.0.0.1:3306/app?table=dlock_locks&ttl=10s
//	mysql://user:password@db.example:3306/app?tls=true
//
// Parameters: table (the lock table, default "dlock_locks", in the URL's database;
// lower-case letters, digits and "_"); max_conns (the pool's limit of open
// connections, default 32, at least 3: two wait for wake-ups, see Waiting; Open
// keeps a second pool of a quarter as many, at least 2, for semaphores' and
// readers' short grants, see Semaphores and read-write locks); these parameters of the Go MySQL driver, under its
// names: tls (true, skip-verify, preferred or false; the default is false),
// timeout, readTimeout, writeTimeout, allowCleartextPasswords, allowNativePasswords,
// allowFallbackToPlaintext, serverPubKey, compress, maxAllowedPacket,
// connectionAttributes, charset (names, comma-separated), collation (a name); and the core's ttl, renew, drift, owner.
// Any other parameter is an error (the driver would send an unknown name to the
// server as a session variable; some of its own would change how replies read). The
// port defaults to 3306; the password is never printed (errors show the URL with
// it replaced).
//
// # Schema
//
// Open creates the tables if they do not exist (CREATE TABLE IF NOT EXISTS, which
// the server serialises on the table's metadata lock, so that many clients starting
// at once create them once; a client without the CREATE privilege works on tables an
// administrator made, and is refused with an error matching driver.ErrAuth when
// they are missing). Tables made before the value columns existed get them at
// Open (ALTER TABLE ... ADD COLUMN, which needs the ALTER privilege once; so do
// the handoff columns handed, ttl and nonce; clients of a version before them must
// not share the tables with clients of this one):
//
//	CREATE TABLE dlock_locks (
//	    lock_key   VARBINARY(512) NOT NULL PRIMARY KEY,
//	    owner      VARBINARY(128) NOT NULL,  -- holder, empty when released
//	    value      VARBINARY(4096) NULL,     -- the grant's value (driver.Valuer)
//	    token      BIGINT UNSIGNED NOT NULL, -- fencing token of the last grant
//	    expires_at DATETIME(6) NOT NULL,     -- server clock, UTC: UTC_TIMESTAMP(6) + TTL
//	    queued     TINYINT NOT NULL DEFAULT 0, -- places may be queued
//	    handed     BIGINT UNSIGNED NOT NULL DEFAULT 0 -- id of the last place granted the key
//	) ENGINE=InnoDB;
//	CREATE TABLE dlock_locks_queue (
//	    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, -- line order
//	    lock_key   VARBINARY(512) NOT NULL,
//	    owner      VARBINARY(128) NOT NULL,  -- the waiter
//	    value      VARBINARY(4096) NULL,     -- the value its grant will have
//	    conn       BIGINT UNSIGNED NOT NULL, -- its client's listening connection
//	    ttl        BIGINT UNSIGNED NOT NULL DEFAULT 0, -- its grant's TTL (µs)
//	    nonce      VARBINARY(16) NOT NULL DEFAULT '', -- written by the place's insert
//	    expires_at DATETIME(6) NOT NULL,     -- the place lapses: now + patience
//	    lim        INT NOT NULL DEFAULT 0,   -- a semaphore's limit (0: a mutex's place)
//	    shared     TINYINT NOT NULL DEFAULT 0, -- a reader's place
//	    woken      BIGINT UNSIGNED NOT NULL DEFAULT 0, -- odd: woken by a release, not yet attempted
//	    UNIQUE KEY place (lock_key, owner), KEY conn (conn)
//	) ENGINE=InnoDB;
//	CREATE TABLE dlock_locks_sem (           -- permits: semaphores and read-write locks
//	    lock_key   VARBINARY(512) NOT NULL,
//	    owner      VARBINARY(128) NOT NULL,
//	    token      BIGINT UNSIGNED NOT NULL, -- taken from the key's row
//	    expires_at DATETIME(6) NOT NULL,     -- server clock, UTC
//	    value      VARBINARY(4096) NULL,
//	    shared     TINYINT NOT NULL DEFAULT 0, -- a reader's
//	    PRIMARY KEY (lock_key, owner)
//	) ENGINE=InnoDB;
//
// The permit table is made at Open like the others; a user that can neither make
// nor use it keeps working mutexes, and its semaphore and shared lock calls fail
// with an error matching driver.ErrUnsupported. A table name may therefore not end
// in "_sem" (nor "_queue").
//
// Using them needs SELECT, INSERT, UPDATE and DELETE on both tables; waking a waiter
// of another MySQL user needs the CONNECTION ADMIN (MySQL 8) or CONNECTION ADMIN /
// SUPER (MariaDB) privilege (see below). Keys and owners are compared as bytes.
//
// # Algorithm
//
// A key has one row, the lease, from its first grant on: it is kept after a release
// (empty owner, expires_at in the past), so that the row's token is the key's counter.
// Acquire is one statement, INSERT ... ON DUPLICATE KEY UPDATE, run by the server
// under the row's lock: a new key's row is inserted with a first token of the
// server's time in microseconds; an existing row that is free (released or
// expired) and has no live place of another owner queued ahead of the caller's
// (FIFO: a newcomer does not pass a waiter) is taken with its token plus one; the
// caller's own live row is re-entered (same token, TTL extended) only when the
// request says Reenter (driver.Request), and otherwise left as it is; a live row of
// another owner is left as it is. The statement hands the row's token back through
// LAST_INSERT_ID(), which the server returns in the statement's OK reply, and the
// number of affected rows (1 inserted, 2 updated, 0 unchanged) says whether the
// caller was granted: an uncontended acquire is one round trip (a refused one reads
// the holder's remaining TTL in a second, driver.HeldError.RetryAfter).
//
// The FIFO check reads the queue table, and a subquery costs a MySQL statement about
// as much as the rest of it (measured: the acquire was 1.35x its INSERT floor with
// it). So a caller with no place of its own first runs the statement without it: the
// row is free only if it is also not marked queued (see Waiting: a key's first
// waiter marks the row before it writes its place, and the mark stays while places
// live). Refused, that statement says through LAST_INSERT_ID whether the row is held
// (and marked) or free but marked; in the second case the full statement, with the
// queue read, decides at once. A waiter with a place always runs the full one.
//
// Refresh and
// Release are one UPDATE each, comparing the owner and the expiry; Release clears
// the owner and sets the expiry in the past when no place is queued (the row's
// queued mark), so an uncontended cycle is two statements, like the INSERT +
// DELETE floor; otherwise it hands the key on (see Waiting). Expiry is computed by the server, UTC_TIMESTAMP(6) + TTL,
// so client clocks (and the session time zone) never matter.
//
// The statements with parameters that the hot paths run are prepared once on each
// connection that first runs them (server-side prepared statements, about 15 per
// connection of the pool, and about 20 more on connections that run semaphores' statements, counted against the server's max_prepared_stmt_count,
// closed by Close), so that each is one round trip; database/sql would otherwise
// prepare, run and close every one of them (two round trips). A server at that
// limit gets the statement as before (prepared, run and closed).
//
// # Waiting
//
// MySQL has no LISTEN/NOTIFY. Each client keeps one listening connection (opened by
// its first wait, closed by Close) that waits in GET_LOCK for a random lock name
// that a second connection of the client, its anchor, holds (so the wait lasts
// until it is ended; if the anchor's connection is lost, the wait returns and the
// listener starts again on new connections). Not SLEEP(): on MariaDB every
// sleeping session shares one mutex, and a KILL QUERY that finds it taken retries
// for up to seconds; under a hot key every KILL took 1-2 s for minutes at a time,
// where a lock wait, whose mutex is its own, ends at once. A refused
// attempt that will wait upserts its place (its owner, that connection's
// CONNECTION_ID(), its grant's TTL and value, a random nonce written by the insert
// alone, and an expiry of its patience) in the queue table; the first waiter of a
// key (its attempt found the row held and not marked) marks the row first. A new
// place then reads the key's row (one read): a row not marked queued (a handoff
// that found no live place unmarked it meanwhile) is marked, and a row that was
// not marked or is free is attempted once more (a release that came before the place handed the
// key to no one). A waiting
// Lock of a key this client handed on to a waiter less than 20 ms before queues
// at once, without first making the attempt that would most likely be refused.
//
// A release of a marked row (or of a key this client was just granted through its
// place) is one statement, a multi-table UPDATE, that hands the key directly to the
// first live place after the row's handed mark (driver.Waiter's direct handoff):
// the row becomes that place's grant, with the token plus one, the place's value
// and an expiry of the place's TTL on the server clock, and handed = the place's
// id (places are handed the key in id order, so every place up to that id has had
// its turn and none is handed the key twice); the statement returns that place's
// listening connection through LAST_INSERT_ID, and the releaser ends its wait with
// KILL QUERY <connection id>. With no live place the row is released and
// unmarked. The woken listener reads the live grants handed to its places (one
// read, no write) and gives each to its waiter, whose next Acquire returns it
// without a statement, with Grant.Age counted from when the place was first
// written (the key was handed after that). The place, which had its turn, is
// deleted in the background, within 100 ms, in one statement with the other
// places of the client that had their turn meanwhile (one commit for them all);
// if its owner queues again on this client first, the new place replaces it
// (REPLACE, a new id at the end of the line), one write where a deletion and an
// insert were two. Until then it is passed over like any place that had its turn. The listener's wait first checks for grants it has
// not delivered, so a KILL that came between two of its statements is not lost;
// a wake-up lost otherwise (a connection lost) is covered by the core's bounded
// fallback retry, whose attempt claims a grant handed to the caller's own place
// (the place's nonce is this client's), or re-enters it (Request.Reenter).
// Queued waiters' retries renew their place, one write each. A grant by an
// attempt counts only the place this client made (by its nonce) as the caller's,
// served: a place of the same owner id made by another client (another process
// of that owner id) stays in line, since its waiter would read the key as handed
// to it and hold it too.
//
// A newcomer does not pass a live place not yet handed the key (FIFO), with two
// gaps: two places inserted at once may commit out of id order, and if the later id
// is handed the key first, the earlier one falls behind the row's handed mark and is
// skipped; its next retry places it again at the end of the line (FIFO holds among
// the places committed before each handoff; no place is handed the key twice). And a
// release that hands the key to no one between a first waiter's mark and its place
// unmarks the row, so a newcomer may take the key before the waiter marks it again
// (one turn lost, once). A waiter
// that gives up makes its place lapse first (no release hands it the key after
// that), then hands on a grant already handed to its place, whether its Acquire
// returned it or not, and deletes the place; if that fails (the server is down or
// restarting), the client tries again in the background, with pauses growing to a
// second, until it succeeds or the client closes (until then the place would stay
// live for the rest of its patience, first in line, and a holder's lease that
// lapsed without a release would go to no one). A crashed waiter's place lapses after
// its patience; a key handed to it before that is held for the place's TTL, like
// a crashed holder's grant, and then taken by the next waiter's retry.
//
// KILL QUERY needs no privilege for connections of the same MySQL user (the usual
// case: all clients share a user); for another user's it needs CONNECTION ADMIN or
// SUPER, and without it the wake-up is lost and the waiter falls back to its retry
// timer. Connection ids rise and are not reused (until 2^32 on older servers), so a
// place left by a crashed client names no other session while it lives.
//
// Costs: two connections per client for waiting, whatever the number of waiters (the
// pool's other connections are shared, at most max_conns in all). A handoff is one
// write (the release, which grants the key) and a KILL by the releaser, and one read
// by the woken listener; the waiter's place costs one write to make (and a read of
// the row), and a share of one to delete, off the handoff's path (none when its
// owner queues again first: the new place replaces it).
//
// # Cancelled calls
//
// The Go MySQL driver ends a call whose context is done by closing the call's
// connection; the server notices only when the statement ends. A statement that
// was waiting for a key's row lock (behind a hot key's other statements) keeps
// waiting and then runs: an acquire may still grant the key to a caller that has
// gone (the core releases such a grant when the call's owner id was its own; one
// of a stable owner id expires after its TTL). Meanwhile it holds a server
// connection, and the client's pool opens another for its next call. With the
// server's default innodb_lock_wait_timeout of 50 s, 8 clients looping on one key
// with calls cut short after 5 to 65 ms filled the test server's 400 connections
// (peaks of 308 and 395, and 38 and 95 grants in 6 s, in two runs with -race on a
// loaded machine): hundreds of
// abandoned statements queued on the row, each running when its turn came. The
// connections Open makes therefore set innodb_lock_wait_timeout=1 (one second, at
// connect), and a statement or transaction of dlock's that times out so (error
// 1205) is run again, like a deadlock's victim, while its call has not given up:
// the same runs peaked at 34 connections, with 163 and 174 grants. A pool passed
// to New keeps its own setting; give it the same one.
//
// The insert of a waiter's place is not cut short: it runs to its end (for up to
// 5 s after the call gives up) before the call returns, so that the withdrawal
// that follows finds the place. Cut short, it could make the place after the
// withdrawal, live and first in line for its patience, and a release would hand
// the key to it: held by no one for its TTL.
//
// A transaction holds a key's row lock for several round trips (a semaphore's or
// read-write lock's attempt and release, AcquireAll), so under many calls cut
// short its abandoned statements queued faster than the row lock served them, and
// a second's wait was still too long: readers, writers and a semaphore's holders
// on 8 clients, calls cut short after 5 to 65 ms, reached the 400 connections in
// some runs. A transaction (and the one request of a short grant, see
// Semaphores and read-write locks) therefore runs on a connection whose server id
// the client knows (read once per connection), and a call that gives up ends its
// statement with KILL QUERY (the same privilege as the wake-ups above) and drops
// that connection (it never goes back to the pool, so the KILL meets no other
// call's statement, and its place in the pool serves the KILL): the same test
// peaked at 55 to 57 connections (64 to 156 without, in runs that stayed under
// the limit). With two CPU hogs beside it, it still reached 401 connections: the
// releases the core sends in the background for calls cut short (each may hold
// the key) queued on the row, one connection each; since the core sends at most
// four at once per client (see package dlock), 40 runs so peaked at 59 to 65.
//
// # Several keys at once
//
// AcquireAll (driver.MultiAcquirer, dlock.Client.LockAll and the like) runs the
// acquire statement of every key in one transaction, in ascending key order, and
// commits only if every key was granted: a refused key rolls back the others (their
// tokens too), so no one ever sees part of a set held. A transaction chosen as a
// deadlock's victim is run again, at most 8 times.
//
// # Values and listing
//
// A grant's value (dlock.WithValue, Proclaim; driver.Valuer) is written by the
// granting statement itself, replaced by a re-entry or SetValue (one UPDATE comparing
// the owner), and cleared by the release; a waiter's place holds the value its grant
// will have.
//
// Queue (driver.Queuer, dlock.Client.Waiters) reads the live places of a key in line
// order, without the place of a waiter that was just granted the key and has not
// deleted its place yet. List (driver.Lister, dlock.Client.List) reads the live rows
// whose key starts with a prefix in one query, a range scan of the primary key, with
// each key's count of live places. Both are reads for administrators, not for a hot
// path.
//
// Not offered (yet): a holder watch (dlock.Client.Observe reads the key every
// WithObserveInterval).
//
// # Semaphores and read-write locks
//
// A lock call with dlock.WithLimit(n > 1) takes one of n permits (driver.Semaphorer),
// one with dlock.WithShared a reader's grant (driver.Sharer); a plain call on such a
// key is a writer. The key's row becomes a state row: owner '#' (no owner id can be
// '#'), value its limit in decimal (1 for a read-write key), token the key's one
// sequence, queued 2, expires_at at least the latest expiry of its live permits. Each
// holder is a row of the permit table with its own token (the row's, plus one, in the
// same transaction: every grant of a key, mutex, permit, reader or writer, takes the
// next token of the key's row), its own expiry on the server clock (renewed by
// Refresh of (key, owner), in one statement that extends the state row's expiry too;
// a crashed holder's permit lapses after its TTL) and value.
//
// The mutex statements never take a state row: acquireFast takes only a row whose
// queued mark is 0 and says refusedHeld + 2 of a live state row; the full acquire
// statement and ForceRelease's handoff skip owner '#'; release, handoff, refresh and
// SetValue compare an owner id, which is never '#'. A mutex attempt so refused (or
// one whose full statement refused a free row: one read tells) is decided by the
// semaphore path, which refuses it with driver.ErrLimitMismatch on a semaphore's key,
// and treats it as a writer on a read-write key (a writer finding the key free takes
// it back as a plain mutex's row). Refresh, Release and SetValue go to the permit
// table for a grant this client took as a permit, and otherwise there only when the
// mutex statement says not held: a mutex's cycle costs what it did.
//
// A semaphore attempt is one transaction: SELECT the key's row FOR UPDATE, read its
// live places and permits, decide, write, commit (a new key's row is first inserted
// released, on its own: many locking reads of a missing row deadlock when they all
// insert). It is granted when the free permits outnumber the live places ahead of the
// caller's (a newcomer has every place ahead: no newcomer takes a permit a waiter
// waits for); a reader when no writer holds and only readers are ahead of it (so a
// reader arriving behind a queued writer waits); a writer when no one holds and no
// place is ahead. A refused attempt that waits writes its place (its limit, whether
// it is a reader, its client's listening connection) at the end of the line, or
// renews it. A key with no live permit and no live place is free: the next attempt
// sets its limit; otherwise another limit, a reader on a semaphore's key, or a mutex
// on either is refused with driver.ErrLimitMismatch, writing nothing. A reader that
// waits behind a mutex's holder turns the key into a read-write key in its
// transaction: the holder's grant becomes a writer's permit (same token, expiry and
// value; its Refresh and Release find it there) and the mutex's places writers'.
// When that grant was handed by a mutex's release to a waiter's place that had not
// claimed it yet, the waiter's next attempt claims the permit (its place's nonce
// tells it from another client's of the same owner), and its Stop frees it. A
// holder's re-entry (Request.Reenter) keeps its token and takes the request's
// kind: a reader's re-entry as a writer is granted only while it is the key's one
// holder.
//
// The attempt's read of permits and places is a plain SELECT, made under the row's
// lock. That matters on MariaDB, whose read view is not an atomic snapshot: it copies
// the set of active transactions while they commit, so it may show one transaction's
// writes without those of another that committed before it. Every grant holds the
// row's lock until it commits, so none commits while the attempt's view is taken;
// only a release can, and a release the view misses counts as still held, which
// refuses rather than over-grants. The shorter path below decides with locking reads.
//
// A release that finds places queued (and a ForceRelease, which frees every permit,
// and a waiter giving up) locks the row the same way and deletes the permit (or
// place); it does not hand the permit over, and leaves the row's expiry bound as it
// was (an upper bound: it only has to be at least every live permit's). It makes odd
// (pending) the woken count of the places the key now admits that are not pending
// already (the first n - held places of a semaphore; of a read-write key, the leading
// run of readers when no writer holds, or the first place, a writer, when no one
// holds) and, after its commit, ends the waits of their clients' listening
// connections with KILL QUERY, as a mutex's handoff does. The listener's wait returns
// at once while a pending place of its connection has a count it has not delivered
// (so a KILL that came between its statements is not lost), and its read of the
// grants handed to its places reads those counts too. The woken waiter attempts
// again, FIFO-checked, and takes the permit; refused, its attempt makes the count
// even, so that a later release wakes it again (a pending place is not woken twice).
// Such a release that leaves no permit and no place makes the row a released mutex's
// again.
//
// With no place queued there is a shorter path. A reader's grant on a read-write
// key with no writer's permit, or a permit's on a semaphore of the request's limit
// with a permit free, is one UPDATE of the row (the next token and the expiry bound,
// guarded by reads of the permits and of the live places) and the permit's INSERT,
// in one transaction.
//
// A backend made by Open sends that transaction as one request (START
// TRANSACTION, the UPDATE, the INSERT if the UPDATE changed the row, a read of the
// outcome, COMMIT) on a connection of a second, smaller pool whose connections take
// several statements at once, their parameters written into the text by the
// driver, escaped (multiStatements and interpolateParams, which the URL cannot
// set). The row then stays locked for the time the server takes to run them, not
// for three round trips. A statement of it that fails stops the rest and may leave
// the transaction open, so its connection is closed (the server rolls the
// transaction back), never returned to the pool. Escaping holds only in character
// sets that read it back as written: the second pool is made only when the URL's
// charset, if any, lists only utf8mb4, utf8, utf8mb3, latin1, ascii or binary, and
// each of its new connections is asked for the set the server reads it in (a
// server may choose its own: skip-character-set-client-handshake, init_connect);
// the first that is not one of those turns the pool off. Then, and for a backend
// made by New on the caller's pool, the statements go one by one (BEGIN, UPDATE,
// INSERT, COMMIT), the row locked for two round trips.
//
// A permit's release is one DELETE of the permit joined to the row (share-locked);
// it leaves the row's expiry bound as it was and the row a state row, free to the
// next attempt of any kind once no permit is live. Statements that lock a key's row
// and a permit lock the row first (STRAIGHT_JOIN), so they do not deadlock.
//
// Costs: with no place queued, a permit's or a reader's grant is one request (four
// round trips on New's pool) and a commit, against a mutex's one; its release
// one statement, like a mutex's; its refresh one statement. Otherwise an attempt or
// a release is a transaction of six to eight round trips that holds the key's row
// lock. Waiting costs what a mutex's does (the same listener), but a freed permit is
// taken by the woken waiter's own attempt: one KILL, one read by the listener, and
// the waiter's transaction, not a handoff in the releasing statement. Not promised
// beyond a mutex's: the FIFO gaps named under Waiting; a woken waiter that crashed
// holds up the permits it was woken for until its place lapses (its patience); a
// permit that expires (a crashed holder) wakes no one, and waiters take it on their
// fallback retry, which waits at most until the first permit's expiry; a crashed
// holder's expired permit row stays until the key is free and taken with another
// limit or by a mutex. AcquireAll takes a key whose row is a state row with no
// live permit and no live place as a mutex's (reading both with share locks in its
// transaction), as Acquire does, and refuses one that has either.
//
// # Safety model
//
// Mutual exclusion holds on one server (or a primary whose failover promotes a
// replica that had every committed grant: semi-synchronous replication, or
// Galera/InnoDB Cluster, whose certification turns a conflicting grant into a
// failed statement): the row is the lock, a grant is committed (autocommit) before
// it is reported, and expiry uses only the server's clock. The client's local
// validity deadline (TTL minus drift, from when the request was sent) ends before
// the server-side expiry.
//
// Fencing tokens rise strictly for every grant of a key: each grant adds one to the
// token in the row it writes, in the same statement, and lease rows are never
// deleted by this package. They survive a crash or restart as long as commits are durable:
// innodb_flush_log_at_trx_commit=1 (the default; 0 or 2 may lose the last second of
// grants on an operating-system or server crash, and a lost grant's token could be
// issued again). A row deleted by hand is inserted again with the server time in
// microseconds, above its earlier tokens unless the server clock went back.
//
// The statements assume REPEATABLE READ, InnoDB's default. Under READ COMMITTED
// (a common server setting) InnoDB reads the subqueries of an UPDATE or INSERT ...
// SELECT without locks, so a grant may count a key's permits as they were before
// another grant committed: 16 clients of a semaphore of 3 were measured holding up
// to 7 permits at once. So Open's connections set their session's isolation level
// (SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ) whatever the server's
// default, and New refuses a pool whose sessions run READ COMMITTED or READ
// UNCOMMITTED (it accepts SERIALIZABLE, which only adds locks). Likewise every
// statement outside a transaction must commit on its own: on a server whose
// default is autocommit=0 a grant would stay uncommitted, its row locked, on a
// pooled connection (the conformance suite hung). Open's connections set
// autocommit=1, and New refuses a pool whose sessions have it off.
//
// What is NOT promised: with asynchronous replication, a failover to a replica that
// had not received a grant lets a second holder in and may reissue tokens. A server
// whose clock jumps forward expires grants early. In those cases only fencing (the
// protected resource checking tokens) keeps you safe.
//
// # MySQL and MariaDB
//
// The statements are the same on MySQL 8 and MariaDB 10.11+ (tests run on MariaDB).
// MySQL 8.0.20 and later warn that VALUES() in ON DUPLICATE KEY UPDATE is deprecated
// (it still works; the row alias that replaces it is unknown to MariaDB).
package mysqllock
