-- dimmem Postgres schema, version 3: the lexical path moves into the runtime's per-user in-process index
-- (dimmem.runtime.lexical_index), one analyzer for both backends. A record is stamped with its user's next
-- change number (`seq`, counted in user_stats) whenever it is indexed or unindexed, so each process re-reads
-- only what changed; `epoch` moves when a user is replaced wholesale. The tsvector column, its GIN index
-- and the per-user BM25 totals go: the index keeps those itself.

ALTER TABLE user_stats ADD COLUMN epoch bigint NOT NULL DEFAULT 0, ADD COLUMN seq bigint NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN seq bigint NOT NULL DEFAULT 0;

-- Number the records already stored, every tenant's: row-level security would hide them from the owner,
-- so it is lifted for the length of this transaction.
ALTER TABLE records NO FORCE ROW LEVEL SECURITY;
ALTER TABLE user_stats NO FORCE ROW LEVEL SECURITY;
UPDATE records r SET seq = n.seq
FROM (SELECT tenant, user_id, id, row_number() OVER (PARTITION BY tenant, user_id ORDER BY created, id) AS seq
      FROM records) n
WHERE r.tenant = n.tenant AND r.user_id = n.user_id AND r.id = n.id;
UPDATE user_stats s SET seq = m.seq
FROM (SELECT tenant, user_id, max(seq) AS seq FROM records GROUP BY tenant, user_id) m
WHERE s.tenant = m.tenant AND s.user_id = m.user_id;
ALTER TABLE records FORCE ROW LEVEL SECURITY;
ALTER TABLE user_stats FORCE ROW LEVEL SECURITY;

CREATE INDEX records_seq ON records (tenant, user_id, seq);

DROP INDEX records_search;
ALTER TABLE records DROP COLUMN search_tokens, DROP COLUMN search;
DROP FUNCTION dimmem_tsvector_tokens(tsvector);
DROP FUNCTION dimmem_search_text(text, text[], text, text, text);
ALTER TABLE user_stats DROP COLUMN docs, DROP COLUMN tokens;

-- The dimension path's time lookup reads the latest-starting records first, ties by id, from the index.
DROP INDEX records_time;
CREATE INDEX records_time ON records (tenant, user_id, t_start DESC, id) WHERE status = 'active';
