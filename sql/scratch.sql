-- Named queries of the scratch databases (reliableq/scratch.py): who owns them, and which are left over.

-- name: owner_lock
-- Take this process's owner lock, held by its session until the process ends (however it ends).
SELECT pg_advisory_lock(%(owner_class)s, %(token)s);

-- name: owners_alive
-- The tokens whose owner lock some session holds (advisory locks are listed for the whole server).
SELECT objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = %(owner_class)s::bigint::oid;

-- name: databases
-- Every database of the server whose name could be a scratch database's, the newest first: what a run
-- killed a moment ago left is swept before what a server collected over weeks.
SELECT datname FROM pg_database WHERE datname LIKE 'rq\_%%' ORDER BY oid DESC;

-- name: database_exists
-- Whether the server has a database of this name.
SELECT 1 FROM pg_database WHERE datname = %(name)s;
