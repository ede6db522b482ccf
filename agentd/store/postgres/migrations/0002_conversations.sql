-- Journals and conversation records (agentd.store.postgres.journal).

-- One row per conversation: its record checkpoint, the masked wire.ConversationRecord JSON,
-- the same bytes the file store keeps in <id>/record.json.
CREATE TABLE conversations (
    id          text PRIMARY KEY,
    record      bytea NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The journal: seq 1..n per conversation with no gap; only the lease holder appends, and the
-- primary key refuses a second writer's seq. It is also the index every read uses:
-- WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3.
CREATE TABLE journal (
    conversation_id  text        NOT NULL,
    seq              bigint      NOT NULL CHECK (seq >= 1),
    ts               timestamptz NOT NULL,          -- milliseconds, as journaled
    type             text        NOT NULL,
    run              text        NOT NULL DEFAULT '',
    data             bytea       NOT NULL,          -- the JSON payload exactly as journaled (masked)
    PRIMARY KEY (conversation_id, seq)
);
