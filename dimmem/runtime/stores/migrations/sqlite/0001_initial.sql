-- dimmem SQLite schema, version 1: records with every dimension, their version history, the keyword
-- index of update candidates, the source turns their pointers resolve to, and the dense vectors.
-- PRAGMA user_version records how many migrations have run.

CREATE TABLE records (
    id TEXT NOT NULL, user_id TEXT NOT NULL, conversation_id TEXT, window_id TEXT,
    type TEXT NOT NULL, speaker TEXT NOT NULL, content TEXT NOT NULL, time TEXT, t_start TEXT, t_end TEXT,
    location TEXT, reason TEXT, purpose TEXT, keywords TEXT NOT NULL, source_turns TEXT NOT NULL,
    session_time TEXT, created REAL NOT NULL, updated REAL NOT NULL, version INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'active', PRIMARY KEY (user_id, id));
CREATE INDEX records_user ON records(user_id, status, type);
CREATE TABLE record_history (
    record_id TEXT NOT NULL, user_id TEXT NOT NULL, version INTEGER NOT NULL, action TEXT NOT NULL,
    snapshot TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (user_id, record_id, version));
CREATE TABLE record_keywords (
    record_id TEXT NOT NULL, user_id TEXT NOT NULL, type TEXT NOT NULL, keyword TEXT NOT NULL);
CREATE INDEX record_keywords_lookup ON record_keywords(user_id, type, keyword);
CREATE TABLE turns (
    user_id TEXT NOT NULL, conversation_id TEXT NOT NULL, turn_id TEXT NOT NULL,
    position INTEGER NOT NULL, speaker TEXT NOT NULL, role TEXT NOT NULL, text TEXT NOT NULL,
    session_time TEXT,
    PRIMARY KEY (user_id, conversation_id, turn_id));
CREATE INDEX turns_position ON turns(user_id, conversation_id, position);
CREATE TABLE vectors (
    record_id TEXT NOT NULL, user_id TEXT NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (user_id, record_id));
CREATE VIRTUAL TABLE records_fts USING fts5(
    record_id UNINDEXED, user_id UNINDEXED, body, tokenize='porter unicode61');
