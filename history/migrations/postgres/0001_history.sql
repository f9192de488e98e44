-- The history store's tables (postgres). JSON is kept as JSONB.

CREATE TABLE responses (
    id                   TEXT PRIMARY KEY,
    previous_response_id TEXT,
    conversation_id      TEXT,
    model                TEXT NOT NULL,
    status               TEXT NOT NULL,
    created_at           BIGINT NOT NULL,
    input                JSONB NOT NULL,
    output               JSONB NOT NULL,
    raw                  JSONB NOT NULL
);
CREATE INDEX responses_previous_response_id ON responses (previous_response_id);

CREATE TABLE conversations (
    id         TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    metadata   JSONB NOT NULL
);

-- seq is the order items were added in (a sequence never hands out a value
-- twice, so a cursor never lands on a newer item).
CREATE TABLE conversation_items (
    seq             BIGSERIAL PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    created_at      BIGINT NOT NULL,
    item            JSONB NOT NULL
);
CREATE INDEX conversation_items_conversation_seq ON conversation_items (conversation_id, seq);
