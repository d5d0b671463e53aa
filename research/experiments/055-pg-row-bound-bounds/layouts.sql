-- research/055: what one turn of the row-bound shape costs PostgreSQL inside the server (no protocol, no node), by
-- layout and statement shape. A turn: PER_TURN sources out of 10,000, one record each, the heard sequences moved
-- conditionally, the head taken, the chunks inserted, COMMIT. psql -v variant=V -v turns=N -v per_turn=P -f layouts.sql
--   now    the layout and statements of src/store/postgres.rs (set_heard, take_head, insert_chunks)
--   one    the same layout, the three statements as one (CTEs)
--   nopk   sizing only: chunks without its primary key (chunks_pos alone)
--   nopos  sizing only: chunks without chunks_pos (the primary key alone)
--   multi  sizing only: one chunk row per turn holding every source's record (arrays), both indexes kept
\set ON_ERROR_STOP 1
DROP TABLE IF EXISTS chunks, multi, sources, apps;
CREATE TABLE apps (id SERIAL PRIMARY KEY, name TEXT NOT NULL UNIQUE, head BIGINT NOT NULL DEFAULT 1);
CREATE TABLE sources (id BIGSERIAL PRIMARY KEY, app INTEGER NOT NULL REFERENCES apps(id), name TEXT NOT NULL,
    heard BIGINT NOT NULL DEFAULT 0, UNIQUE (app, name)) WITH (fillfactor = 50);
CREATE TABLE chunks (app INTEGER NOT NULL, source BIGINT NOT NULL, first_seq BIGINT NOT NULL, count INTEGER NOT NULL,
    body BYTEA NOT NULL, pos BIGINT NOT NULL, stored_at BIGINT NOT NULL, format SMALLINT NOT NULL);
SELECT CASE WHEN :'variant' IN ('now', 'one', 'nopos') THEN 'ALTER TABLE chunks ADD PRIMARY KEY (app, source, first_seq)'
            WHEN :'variant' = 'multi' THEN 'ALTER TABLE chunks ADD PRIMARY KEY (app, source, first_seq)'
            ELSE 'SELECT 1' END AS pk \gset
:pk;
SELECT CASE WHEN :'variant' = 'nopos' THEN 'SELECT 1' ELSE 'CREATE UNIQUE INDEX chunks_pos ON chunks (app, pos)' END AS pos \gset
:pos;
CREATE TABLE multi (app INTEGER NOT NULL, pos BIGINT NOT NULL, sources BIGINT[] NOT NULL, firsts BIGINT[] NOT NULL,
    bodies BYTEA[] NOT NULL, stored_at BIGINT NOT NULL, PRIMARY KEY (app, pos));
INSERT INTO apps (name) VALUES ('main');
INSERT INTO sources (app, name) SELECT 1, 'dev-' || lpad(i::text, 5, '0') FROM generate_series(0, 9999) i ORDER BY 1, 2;
ANALYZE;
CHECKPOINT;
CREATE OR REPLACE PROCEDURE turns(n_turns int, per_turn int, variant text) LANGUAGE plpgsql AS $$
DECLARE
  t int; ids bigint[]; olds bigint[]; news bigint[]; offs bigint[]; bodies bytea[]; h bigint; k bigint;
  t0 timestamptz; heard_t interval := '0'; head_t interval := '0'; ins_t interval := '0'; commit_t interval := '0';
  cur int := 0; lsn0 pg_lsn := pg_current_wal_lsn();
BEGIN
  FOR t IN 1..n_turns LOOP
    SELECT array_agg(s.id ORDER BY s.name), array_agg(s.heard ORDER BY s.name), array_agg(s.heard + 1 ORDER BY s.name)
      INTO ids, olds, news
      FROM sources s WHERE s.id IN (SELECT 1 + (cur + g) % 10000 FROM generate_series(0, per_turn - 1) g);
    SELECT array_agg(g::bigint), array_agg(('\x' || lpad(to_hex(g), 32, '0'))::bytea) INTO offs, bodies
      FROM generate_series(0, per_turn - 1) g;
    cur := cur + per_turn;
    t0 := clock_timestamp();
    IF variant = 'one' THEN
      WITH moved AS (UPDATE sources s SET heard = u.new FROM unnest(ids, olds, news) AS u(id, old, new)
               WHERE s.id = u.id AND s.heard = u.old RETURNING 1),
           hd AS (UPDATE apps SET head = head + per_turn WHERE id = 1 RETURNING head),
           ins AS (INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format)
               SELECT 1, u.s, u.f, 1, u.b, hd.head - per_turn + u.o, 0, 0
               FROM unnest(ids, news, bodies, offs) AS u(s, f, b, o), hd RETURNING 1)
      SELECT 1 / ((SELECT count(*) FROM moved) = per_turn)::int + (SELECT count(*) FROM ins) INTO k;
      ins_t := ins_t + (clock_timestamp() - t0);
    ELSE
      WITH moved AS (UPDATE sources s SET heard = u.new FROM unnest(ids, olds, news) AS u(id, old, new)
        WHERE s.id = u.id AND s.heard = u.old RETURNING 1)
        SELECT 1 / ((SELECT count(*) FROM moved) = per_turn)::int INTO k;
      heard_t := heard_t + (clock_timestamp() - t0); t0 := clock_timestamp();
      UPDATE apps SET head = head + per_turn WHERE id = 1 RETURNING head INTO h;
      head_t := head_t + (clock_timestamp() - t0); t0 := clock_timestamp();
      IF variant = 'multi' THEN
        INSERT INTO multi (app, pos, sources, firsts, bodies, stored_at) VALUES (1, h - per_turn, ids, news, bodies, 0);
      ELSE
        INSERT INTO chunks (app, source, first_seq, count, body, pos, stored_at, format)
          SELECT 1, u.s, u.f, 1, u.b, a.head - per_turn + u.o, 0, 0
          FROM unnest(ids, news, bodies, offs) AS u(s, f, b, o), apps a WHERE a.id = 1;
      END IF;
      ins_t := ins_t + (clock_timestamp() - t0);
    END IF;
    t0 := clock_timestamp();
    COMMIT;
    commit_t := commit_t + (clock_timestamp() - t0);
  END LOOP;
  RAISE NOTICE '{"variant":"%","turns":%,"per_turn":%,"heard_us":%,"head_us":%,"insert_us":%,"statements_us":%,"commit_ms_per_turn":%,"wal_bytes":%}',
    variant, n_turns, per_turn,
    round(extract(epoch FROM heard_t) * 1e6 / (n_turns * per_turn), 3),
    round(extract(epoch FROM head_t) * 1e6 / (n_turns * per_turn), 3),
    round(extract(epoch FROM ins_t) * 1e6 / (n_turns * per_turn), 3),
    round(extract(epoch FROM heard_t + head_t + ins_t) * 1e6 / (n_turns * per_turn), 3),
    round(extract(epoch FROM commit_t) * 1e3 / n_turns, 3),
    round((pg_current_wal_lsn() - lsn0) / (n_turns * per_turn)::numeric, 1);
END $$;
CALL turns(20, :per_turn, :'variant');
CALL turns(:turns, :per_turn, :'variant');
