-- dimmem SQLite schema, version 6: a record's keyword rows are deleted through the lookup index (the
-- record's type and keywords, as they were indexed), so the per-record index goes: one index fewer to
-- write per keyword.

DROP INDEX record_keywords_record;
