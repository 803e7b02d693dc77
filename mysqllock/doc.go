// Package mysqllock is the dlock backend for MySQL and MariaDB (URL schemes mysql://
// and mariadb://), on database/sql with the go-sql-driver/mysql driver.
//
//	mysql://user:password@127.0.0.1:3306/app?table=dlock_locks&ttl=10s
//	mysql://user:password@db.example:3306/app?tls=true
//
// Parameters: table (the lock table, default "dlock_locks", in the URL's database;
// lower-case letters, digits and "_"); max_conns (the pool's limit of open
// connections, default 32, at least 3: two wait for wake-ups, see Waiting); these parameters of the Go MySQL driver, under its
// names: tls (true, skip-verify, preferred or false; the default is false),
// timeout, readTimeout, writeTimeout, allowCleartextPasswords, allowNativePasswords,
// allowFallbackToPlaintext, serverPubKey, compress, maxAllowedPacket,
// connectionAttributes, charset, collation; and the core's ttl, renew, drift, owner.
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
//	    UNIQUE KEY place (lock_key, owner), KEY conn (conn)
//	) ENGINE=InnoDB;
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
// connection of the pool, counted against the server's max_prepared_stmt_count,
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
// Queued waiters' retries renew their place, one write each.
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
// returned it or not, and deletes the place. A crashed waiter's place lapses after
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
// Not offered (yet): semaphores and read-write locks (a Lock with dlock.WithLimit
// above 1 or dlock.WithShared fails with an error matching dlock.ErrUnsupported,
// changing nothing), and a holder watch (dlock.Client.Observe reads the key every
// WithObserveInterval).
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
