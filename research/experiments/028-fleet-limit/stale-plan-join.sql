-- research/028: stale-plan.sql with the lock written as a join against the names (a candidate, not what the engine runs).
PREPARE lock_sources(int, text[]) AS SELECT s.id, s.name, s.heard FROM unnest($2::text[]) AS n(name) JOIN sources s ON s.app = $1 AND s.name = n.name ORDER BY s.id FOR UPDATE OF s;
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
