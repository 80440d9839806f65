-- River's job table as River v0.51.2's migrations (line main, versions 1
-- to 8) leave it, columns only: sqlc reads it to type the lab's reads of
-- River's jobs (queries/lab/river.sql). A River database is never built
-- from this file: relaylab-river migrate applies River's own migrations
-- (rivermigrate). Keep it in step with the version that
-- experiment/river/go.mod requires; the burn-down's test runs every
-- statement that reads it against a database River migrated.

CREATE TYPE river_job_state AS ENUM (
    'available',
    'cancelled',
    'completed',
    'discarded',
    'pending',
    'retryable',
    'running',
    'scheduled'
);

CREATE TABLE river_job (
    id            bigserial       PRIMARY KEY,
    state         river_job_state NOT NULL DEFAULT 'available',
    attempt       smallint        NOT NULL DEFAULT 0,
    max_attempts  smallint        NOT NULL DEFAULT 25,
    attempted_at  timestamptz,
    created_at    timestamptz     NOT NULL DEFAULT now(),
    finalized_at  timestamptz,
    scheduled_at  timestamptz     NOT NULL DEFAULT now(),
    priority      smallint        NOT NULL DEFAULT 1,
    args          jsonb           NOT NULL,
    attempted_by  text[],
    errors        jsonb[],
    kind          text            NOT NULL,
    metadata      jsonb           NOT NULL DEFAULT '{}',
    queue         text            NOT NULL DEFAULT 'default',
    tags          varchar(255)[]  NOT NULL DEFAULT '{}',
    unique_key    bytea,
    unique_states bit(8)
);
