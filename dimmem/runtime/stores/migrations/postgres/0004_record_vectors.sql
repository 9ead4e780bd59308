-- dimmem Postgres schema, version 4: the dense path's vectors move out of `records` into a table of their
-- own, as SQLite keeps them: each retrieval index owns its storage (dimmem.runtime.stores.indexes), a
-- record row is written once per version instead of once more for its embedding, and only active records
-- have a row here (the HNSW graph holds nothing else).

CREATE TABLE record_vectors (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    record_id text COLLATE "C" NOT NULL,
    embedding vector(384) NOT NULL,  -- all-MiniLM-L6-v2
    PRIMARY KEY (tenant, user_id, record_id)
);

-- Copy every tenant's vectors: row-level security would hide them from the owner for this transaction.
ALTER TABLE records NO FORCE ROW LEVEL SECURITY;
INSERT INTO record_vectors (tenant, user_id, record_id, embedding)
    SELECT tenant, user_id, id, embedding FROM records WHERE status = 'active' AND embedding IS NOT NULL;
ALTER TABLE records FORCE ROW LEVEL SECURITY;

DROP INDEX records_embedding;
ALTER TABLE records DROP COLUMN embedding;
CREATE INDEX record_vectors_embedding ON record_vectors USING hnsw (embedding vector_cosine_ops);

ALTER TABLE record_vectors ENABLE ROW LEVEL SECURITY;
ALTER TABLE record_vectors FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON record_vectors
    USING (tenant = current_setting('dimmem.tenant', true))
    WITH CHECK (tenant = current_setting('dimmem.tenant', true));

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dimmem_runtime') THEN
        GRANT SELECT, INSERT, DELETE ON record_vectors TO dimmem_runtime;
    END IF;
END $$;
