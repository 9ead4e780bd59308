-- dimmem Postgres schema, version 5: a record's keyword rows are deleted by their primary key (the
-- record's type and keywords, as they were indexed), so the per-record index goes. Besides the write it
-- cost per keyword, it misled the planner: on tables without statistics yet (a fresh store, until
-- autovacuum analyzes them) the update path's candidate lookup walked it, filtering every keyword row of
-- the user, instead of the primary key: 8x slower at 1,000 records, and growing with the user.

DROP INDEX record_keywords_record;
