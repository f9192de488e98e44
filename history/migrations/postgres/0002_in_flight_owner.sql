-- Who runs a response while it is in flight, and which gateways are alive.
--
-- A background response is stored `queued`, then `in_progress`, before it
-- ends; a gateway that dies in between leaves it so. `owner` names the
-- gateway instance (`--history-instance`) running it; `history_instances`
-- holds each instance's last heartbeat (unix milliseconds, the database's
-- clock, so replicas' clocks need not agree). A row in flight whose owner
-- is this gateway's own name at its start, or whose owner stopped beating,
-- is ended as failed. Rows in flight written before this migration have
-- no owner: no live gateway can claim them, so they are ended too.

ALTER TABLE responses ADD COLUMN owner TEXT;
CREATE INDEX responses_in_flight ON responses (owner)
    WHERE status IN ('queued', 'in_progress');

CREATE TABLE history_instances (
    instance     TEXT PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL
);
