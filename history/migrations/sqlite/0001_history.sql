-- The history store's tables (sqlite). JSON is kept as TEXT, exactly as the
-- gateway serialized it.

CREATE TABLE responses (
    id                   TEXT PRIMARY KEY NOT NULL,
    previous_response_id TEXT,
    conversation_id      TEXT,
    model                TEXT NOT NULL,
    status               TEXT NOT NULL,
    created_at           INTEGER NOT NULL,
    input                TEXT NOT NULL,
    output               TEXT NOT NULL,
    raw                  TEXT NOT NULL
);
CREATE INDEX responses_previous_response_id ON responses (previous_response_id);

CREATE TABLE conversations (
    id         TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    metadata   TEXT NOT NULL
);

-- seq is the order items were added in; AUTOINCREMENT never reuses a
-- deleted item's seq, so a cursor never lands on a newer item.
CREATE TABLE conversation_items (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    created_at      INTEGER NOT NULL,
    item            TEXT NOT NULL
);
CREATE INDEX conversation_items_conversation_seq ON conversation_items (conversation_id, seq);
