#!/bin/sh
# research/030: the turn's source lock and heard update, prepared while `sources` is small (500 rows, 6 runs, so
# PostgreSQL keeps a generic plan), then run against 100,000 rows with 500 names, under each connection setting.
# Usage: stale-plans.sh SOCKET_DIR  (a cluster whose user postgres may create databases; made and dropped here)
set -eu
H=$1
run() { # run SETTING
  db="stale_$(echo "$1" | tr -c 'a-z' '_' | cut -c1-20)"
  psql -q -h "$H" -U postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  psql -q -h "$H" -U postgres -d "$db" <<SQL
CREATE TABLE apps (id SERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, head BIGINT NOT NULL DEFAULT 1);
CREATE TABLE sources (id BIGSERIAL PRIMARY KEY, app INTEGER NOT NULL REFERENCES apps(id), name TEXT NOT NULL,
    heard BIGINT NOT NULL DEFAULT 0, UNIQUE (app, name));
INSERT INTO apps (name) VALUES ('main');
$1;
PREPARE lock_sources(int, text[]) AS SELECT id, name, heard FROM sources WHERE app = \$1 AND name = ANY(\$2::text[])
    ORDER BY id FOR UPDATE;
PREPARE lock_lateral(int, text[]) AS SELECT s.id, s.name, s.heard FROM unnest(\$2::text[]) AS n(name)
    CROSS JOIN LATERAL (SELECT id, name, heard FROM sources WHERE app = \$1 AND name = n.name FOR UPDATE) s;
PREPARE set_heard(bigint[], bigint[], bigint[], bigint) AS WITH moved AS (UPDATE sources s SET heard = u.new
    FROM unnest(\$1::bigint[], \$2::bigint[], \$3::bigint[]) AS u(id, old, new)
    WHERE s.id = u.id AND s.heard = u.old RETURNING 1) SELECT 1 / ((SELECT count(*) FROM moved) = \$4)::int;
INSERT INTO sources (app, name) SELECT 1, 'dev' || i FROM generate_series(0, ${WARM:-499}) i;
SELECT array_agg('dev' || i)::text AS names FROM generate_series(0, ${WARM:-499}) i \gset
SELECT array_agg(id)::text AS ids, array_agg(0)::text AS olds, array_agg(0)::text AS news FROM sources \gset
\o /dev/null
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
BEGIN; EXECUTE lock_sources(1, :'names'); EXECUTE lock_lateral(1, :'names'); EXECUTE set_heard(:'ids', :'olds', :'news', ${WARM:-499} + 1); COMMIT;
\o
INSERT INTO sources (app, name) SELECT 1, 'dev' || i FROM generate_series(${WARM:-499} + 1, 99999) i;
SELECT array_agg('dev' || i)::text AS names FROM generate_series(0, 99999, 200) i \gset
SELECT array_agg(id)::text AS ids, array_agg(0)::text AS olds, array_agg(1)::text AS news FROM sources
    WHERE name = ANY(:'names'::text[]) \gset
\echo == $1: stale statistics
EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, COSTS OFF) EXECUTE lock_sources(1, :'names');
EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, COSTS OFF) EXECUTE lock_lateral(1, :'names');
EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, COSTS OFF) EXECUTE set_heard(:'ids', :'olds', :'news', 500);
SQL
  psql -q -h "$H" -U postgres -c "DROP DATABASE $db" >/dev/null
}
run "SET plan_cache_mode = auto"
run "SET plan_cache_mode = force_custom_plan"
run "SET enable_seqscan = off"
run "SET enable_seqscan = off; SET plan_cache_mode = auto"
