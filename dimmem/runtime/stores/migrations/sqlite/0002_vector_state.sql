-- Version 2: per-user change counters, so the in-process dense index (stores.indexes.MemoryVectors)
-- knows when to refresh: appended vectors are loaded incrementally (vectors_user keeps a user's rows in
-- rowid order), any removal triggers a reload. Bumped in the same transaction as the change.

CREATE TABLE vector_state (
    user_id TEXT PRIMARY KEY, appended INTEGER NOT NULL DEFAULT 0, removed INTEGER NOT NULL DEFAULT 0);
CREATE INDEX vectors_user ON vectors(user_id);
