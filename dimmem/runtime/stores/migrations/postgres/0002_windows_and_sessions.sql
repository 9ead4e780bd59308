-- dimmem Postgres schema, version 2: appending to a conversation (the SQLite store's migration 3).
-- The session each turn belongs to, and each conversation's windows (the turn ids of their context and
-- new parts), pending (done = false) until their records are stored, so an add that was killed midway is
-- completed by the next add of the conversation.

ALTER TABLE turns ADD COLUMN session_id text;

CREATE TABLE windows (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    idx integer NOT NULL,
    context text[] NOT NULL,
    new text[] NOT NULL,
    done boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tenant, user_id, conversation_id, idx)
);
ALTER TABLE windows ENABLE ROW LEVEL SECURITY;
ALTER TABLE windows FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON windows
    USING (tenant = current_setting('dimmem.tenant', true))
    WITH CHECK (tenant = current_setting('dimmem.tenant', true));

-- the next window of a conversation also continues after the windows its records name
CREATE INDEX records_conversation ON records (tenant, user_id, conversation_id);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dimmem_runtime') THEN
        GRANT SELECT, INSERT, UPDATE ON windows TO dimmem_runtime;
    END IF;
END $$;
