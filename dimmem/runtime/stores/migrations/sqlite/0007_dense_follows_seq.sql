-- dimmem SQLite schema, version 7: the in-process dense index follows the record log's change numbers
-- (`seq`) as the lexical index does, so the counts of vectors appended and removed it compared go.

ALTER TABLE user_stats DROP COLUMN appended;
ALTER TABLE user_stats DROP COLUMN removed;
