#!/bin/sh
# report.sh: a job run under a lock, guarding its PostgreSQL write with the lock's token:
#   dlock run --backend "$DLOCK_URL" nightly-report -- ./report.sh
# dlock run sets DLOCK_TOKEN. The check and the write are in one transaction: a stale
# token makes dlock_fence_check raise, psql stops (ON_ERROR_STOP) and exits with 3, and
# the transaction is rolled back with everything in it.
set -eu
psql "$PGURL" --no-psqlrc --quiet -v ON_ERROR_STOP=1 -v token="$DLOCK_TOKEN" <<'SQL'
BEGIN;
SELECT dlock_fence_check('nightly-report', :'token');
INSERT INTO report (day, total, token) VALUES (current_date, 42, :'token')
  ON CONFLICT (day) DO UPDATE SET total = EXCLUDED.total, token = EXCLUDED.token;
COMMIT;
SQL
