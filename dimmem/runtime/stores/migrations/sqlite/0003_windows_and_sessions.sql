-- Version 3: appending to a conversation: the session each turn belongs to, and the conversation's
-- windows (the turn ids of their context and new parts), pending until their records are stored.

ALTER TABLE turns ADD COLUMN session_id TEXT;
CREATE TABLE windows (
    user_id TEXT NOT NULL, conversation_id TEXT NOT NULL, idx INTEGER NOT NULL, context TEXT NOT NULL,
    new TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (user_id, conversation_id, idx));
