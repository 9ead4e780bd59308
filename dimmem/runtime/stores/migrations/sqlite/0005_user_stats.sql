-- Version 5: the per-user state row has the name and role it has on Postgres: the user's change numbers
-- (`epoch`, `seq`) that the record log stamps and the in-process indexes follow, and (SQLite only) the
-- in-process dense index's counts of vectors appended and removed.

ALTER TABLE index_state RENAME TO user_stats;
