-- Version 4: the lexical path moves from one FTS5 table over all users (every search read every user's
-- postings, and BM25 statistics mixed users) to the in-process per-user BM25 index. A record is stamped
-- with its user's next change number (`seq`) whenever it is indexed or unindexed, so the index re-reads
-- only what changed; `epoch` moves when a user is replaced wholesale. Unindexing a record finds its
-- keyword rows by key, and the dimension path's time lookup walks an index of start days.

ALTER TABLE vector_state RENAME TO index_state;
ALTER TABLE index_state ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE index_state ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
UPDATE records SET seq = rowid;
INSERT INTO index_state (user_id, seq) SELECT user_id, max(rowid) FROM records WHERE true GROUP BY user_id
    ON CONFLICT (user_id) DO UPDATE SET seq = excluded.seq;
CREATE INDEX records_seq ON records(user_id, seq);
DROP TABLE records_fts;
CREATE INDEX record_keywords_record ON record_keywords(user_id, record_id);
DROP INDEX record_keywords_lookup;
CREATE INDEX record_keywords_lookup ON record_keywords(user_id, type, keyword, record_id);
CREATE INDEX records_time ON records(user_id, t_start DESC, id) WHERE status = 'active';
