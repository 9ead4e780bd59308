-- dimmem Postgres schema, version 1. Applied by PostgresStore.migrate() as the schema owner, inside one
-- transaction, under an advisory lock; schema_migrations records it.
--
-- Every table holds one tenant's rows beside the others' and carries `tenant` and `user_id`. Row-level
-- security confines every statement to the tenant of its transaction (`dimmem.tenant`, set by the store
-- with set_config(..., true) at the start of each transaction): a query that forgets the tenant filter
-- still sees nothing of another tenant, and with no tenant set it sees nothing at all. FORCE applies the
-- policies to the table owner too; only superusers and BYPASSRLS roles pass them, so the runtime must not
-- connect as one. Identifier columns use the "C" collation: byte order, as SQLite orders them.

-- pgvector is not a trusted extension: where the owner may not create it, a superuser runs
-- `CREATE EXTENSION vector` once before the first migration (then this line does nothing).
CREATE EXTENSION IF NOT EXISTS vector;

-- The text the lexical path indexes: content, keywords, location, reason, purpose (as SQLite's FTS body).
-- IMMUTABLE is true for these argument types (array_to_string is only STABLE for arbitrary arrays).
CREATE FUNCTION dimmem_search_text(content text, keywords text[], location text, reason text, purpose text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN concat_ws(' ', content, array_to_string(keywords, ' '), location, reason, purpose);

-- Tokens of a tsvector (positions counted): the document length of the BM25 ranking.
CREATE FUNCTION dimmem_tsvector_tokens(doc tsvector)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::integer FROM unnest(doc) AS u);

CREATE TABLE records (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    id text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C",
    window_id text,
    type text NOT NULL,
    speaker text NOT NULL,
    content text NOT NULL,
    time text,
    t_start date,
    t_end date,
    location text,
    reason text,
    purpose text,
    keywords text[] NOT NULL,
    source_turns text[] NOT NULL,
    session_time text,
    created double precision NOT NULL,  -- epoch seconds, as the SQLite store returns them
    updated double precision NOT NULL,
    version integer NOT NULL,
    status text NOT NULL DEFAULT 'active',
    embedding vector(384),  -- all-MiniLM-L6-v2; NULL once the record leaves 'active'
    search tsvector GENERATED ALWAYS AS
        (to_tsvector('english'::regconfig, dimmem_search_text(content, keywords, location, reason, purpose)))
        STORED,
    search_tokens integer GENERATED ALWAYS AS
        (dimmem_tsvector_tokens(to_tsvector('english'::regconfig,
            dimmem_search_text(content, keywords, location, reason, purpose))))
        STORED,
    PRIMARY KEY (tenant, user_id, id)
);
CREATE INDEX records_page ON records (tenant, user_id, created, id);
CREATE INDEX records_active ON records (tenant, user_id, type) WHERE status = 'active';
CREATE INDEX records_time ON records (tenant, user_id, t_start, t_end) WHERE status = 'active';
CREATE INDEX records_search ON records USING gin (search) WHERE status = 'active';
CREATE INDEX records_embedding ON records USING hnsw (embedding vector_cosine_ops);

CREATE TABLE record_history (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    record_id text COLLATE "C" NOT NULL,
    version integer NOT NULL,
    action text NOT NULL,
    snapshot jsonb NOT NULL,
    at double precision NOT NULL,
    PRIMARY KEY (tenant, user_id, record_id, version)
);

-- Update candidates: one row per (active record, casefolded keyword).
CREATE TABLE record_keywords (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    type text NOT NULL,
    keyword text COLLATE "C" NOT NULL,
    record_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (tenant, user_id, type, keyword, record_id)
);
CREATE INDEX record_keywords_record ON record_keywords (tenant, user_id, record_id);

-- The source turns the records' pointers resolve to. Insert-only: a stored turn is never rewritten.
CREATE TABLE turns (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    position integer NOT NULL,
    speaker text NOT NULL,
    role text NOT NULL,
    text text NOT NULL,
    session_time text,
    PRIMARY KEY (tenant, user_id, conversation_id, turn_id)
);
CREATE INDEX turns_position ON turns (tenant, user_id, conversation_id, position);

-- Per user: the active records and their tokens (the BM25 corpus statistics). Every write of a user's
-- records updates this row first, so it is also the user's write lock: two writers of one user take
-- turns (as in SQLite) and can never deadlock on each other's records.
CREATE TABLE user_stats (
    tenant text COLLATE "C" NOT NULL DEFAULT current_setting('dimmem.tenant') CHECK (tenant <> ''),
    user_id text COLLATE "C" NOT NULL,
    docs bigint NOT NULL DEFAULT 0,
    tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, user_id)
);

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['records', 'record_history', 'record_keywords', 'turns', 'user_stats'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I '
            'USING (tenant = current_setting(''dimmem.tenant'', true)) '
            'WITH CHECK (tenant = current_setting(''dimmem.tenant'', true))', t);
    END LOOP;
END $$;

-- The runtime's group role: what the service needs, nothing more (no DDL, no DELETE of records or
-- history). Operators create a login role in it: CREATE ROLE app LOGIN PASSWORD '...' IN ROLE dimmem_runtime.
-- An owner without CREATEROLE stops here, before anything is applied: a superuser creates the role once
-- (CREATE ROLE dimmem_runtime NOLOGIN), then the migration runs through.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dimmem_runtime') THEN
        BEGIN
            CREATE ROLE dimmem_runtime NOLOGIN;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role dimmem_runtime is missing and % may not create it',
                    current_user
                    USING HINT = 'a superuser runs CREATE ROLE dimmem_runtime NOLOGIN once, then migrate again';
            WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile from another database of the cluster
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dimmem_runtime') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO dimmem_runtime', current_schema());
        GRANT SELECT ON schema_migrations TO dimmem_runtime;
        GRANT SELECT, INSERT, UPDATE ON records, turns, user_stats TO dimmem_runtime;
        GRANT SELECT, INSERT ON record_history TO dimmem_runtime;
        GRANT SELECT, INSERT, DELETE ON record_keywords TO dimmem_runtime;
    END IF;
END $$;
