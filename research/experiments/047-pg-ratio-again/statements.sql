-- research/047: the record path's statements at the row-bound shape, inside the server (no protocol, no node),
-- to compare layouts. psql -v ff=FILLFACTOR -v bykey=name|id -f statements.sql
DROP TABLE IF EXISTS chunks, sources, apps;
CREATE TABLE apps (id SERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, head BIGINT NOT NULL DEFAULT 1);
CREATE TABLE sources (id BIGSERIAL PRIMARY KEY, app INTEGER NOT NULL REFERENCES apps(id), name TEXT NOT NULL,
    heard BIGINT NOT NULL DEFAULT 0, UNIQUE (app, name)) WITH (fillfactor = :ff);
CREATE TABLE chunks (app INTEGER NOT NULL, source BIGINT NOT NULL, first_seq BIGINT NOT NULL, count INTEGER NOT NULL,
    body BYTEA NOT NULL, pos BIGINT NOT NULL, stored_at BIGINT NOT NULL, format SMALLINT NOT NULL,
    PRIMARY KEY (app, source, first_seq));
CREATE UNIQUE INDEX chunks_pos ON chunks (app, pos);
ALTER TABLE chunks ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO apps (name) VALUES ('main');
INSERT INTO sources (app, name) SELECT 1, 'dev' || i FROM generate_series(0, 9999) i ORDER BY 'dev' || i;
ANALYZE;
CREATE OR REPLACE PROCEDURE turns(n_turns int, per_turn int, bykey text) LANGUAGE plpgsql AS $$
DECLARE
  t int; names text[]; ids bigint[]; olds bigint[]; news bigint[]; h bigint; k bigint;
  t0 timestamptz; lock_t interval := '0'; heard_t interval := '0'; ins_t interval := '0'; commit_t interval := '0';
  cur int := 0;
BEGIN
  FOR t IN 1..n_turns LOOP
    SELECT array_agg('dev' || ((cur + g) % 10000) ORDER BY 'dev' || ((cur + g) % 10000)) INTO names
      FROM generate_series(0, per_turn - 1) g;
    cur := cur + per_turn;
    t0 := clock_timestamp();
    IF bykey = 'name' THEN
      SELECT array_agg(s.id), array_agg(s.heard), array_agg(s.heard + 1) INTO ids, olds, news
        FROM unnest(names) AS n(name) CROSS JOIN LATERAL (SELECT id, name, heard FROM sources
          WHERE app = 1 AND name = n.name FOR UPDATE) s;
    ELSE
      SELECT array_agg(s.id ORDER BY s.id) INTO ids FROM sources s WHERE app = 1 AND name = ANY(names);
      SELECT array_agg(s.id), array_agg(s.heard), array_agg(s.heard + 1) INTO ids, olds, news
        FROM unnest(ids) AS n(id) CROSS JOIN LATERAL (SELECT id, heard FROM sources
          WHERE id = n.id FOR UPDATE) s;
    END IF;
    lock_t := lock_t + (clock_timestamp() - t0); t0 := clock_timestamp();
    WITH moved AS (UPDATE sources s SET heard = u.new FROM unnest(ids, olds, news) AS u(id, old, new)
      WHERE s.id = u.id AND s.heard = u.old RETURNING 1)
      SELECT 1 / ((SELECT count(*) FROM moved) = per_turn)::int INTO k;
    heard_t := heard_t + (clock_timestamp() - t0); t0 := clock_timestamp();
    UPDATE apps SET head = head + per_turn WHERE id = 1 RETURNING head INTO h;
    INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format)
      SELECT 1, u.s, u.f, 1, '\x0864306133733132'::bytea, h - per_turn + u.o, 0, 0
      FROM unnest(ids, news, (SELECT array_agg(g) FROM generate_series(0, per_turn - 1) g)) AS u(s, f, o);
    ins_t := ins_t + (clock_timestamp() - t0); t0 := clock_timestamp();
    COMMIT;
    commit_t := commit_t + (clock_timestamp() - t0);
  END LOOP;
  RAISE NOTICE 'per row us: lock % heard % insert % commit(per turn ms) %',
    round(extract(epoch FROM lock_t) * 1e6 / (n_turns * per_turn), 2),
    round(extract(epoch FROM heard_t) * 1e6 / (n_turns * per_turn), 2),
    round(extract(epoch FROM ins_t) * 1e6 / (n_turns * per_turn), 2),
    round(extract(epoch FROM commit_t) * 1e3 / n_turns, 3);
END $$;
SET enable_seqscan = off;
CALL turns(40, 500, :'bykey');
CALL turns(100, 500, :'bykey');
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'sources';
