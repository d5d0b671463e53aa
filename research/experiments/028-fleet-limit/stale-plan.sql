-- research/028, "A plan made on an empty table": the engine's lock of a turn's sources (src/store/postgres.rs,
-- lock_sources), prepared and run 6 times while sources holds 500 rows (PostgreSQL then keeps a generic plan),
-- then run with 500 names against 10,000 rows; then again after ANALYZE.
-- Run on a database whose tables a node made: psql -h SOCKET_DIR -U postgres -d DB -f stale-plan.sql
PREPARE lock_sources(int, text[]) AS SELECT id, name, heard FROM sources WHERE app = $1 AND name = ANY($2::text[]) ORDER BY id FOR UPDATE;
INSERT INTO sources (app, name) SELECT 1, 'dev' || i FROM generate_series(0, 499) i;
SELECT array_agg('dev' || i)::text AS names FROM generate_series(0, 499) i \gset
\o /dev/null
EXECUTE lock_sources(1, :'names');
EXECUTE lock_sources(1, :'names');
EXECUTE lock_sources(1, :'names');
EXECUTE lock_sources(1, :'names');
EXECUTE lock_sources(1, :'names');
EXECUTE lock_sources(1, :'names');
\o
INSERT INTO sources (app, name) SELECT 1, 'dev' || i FROM generate_series(500, 9999) i;
SELECT array_agg('dev' || i)::text AS names FROM generate_series(0, 9999, 20) i \gset
EXPLAIN (ANALYZE) EXECUTE lock_sources(1, :'names');
ANALYZE sources;
EXPLAIN (ANALYZE) EXECUTE lock_sources(1, :'names');
