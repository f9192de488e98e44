-- A cancel asked of one replica for a response another replica runs.
--
-- `POST /v1/responses/{id}/cancel` reaches whichever replica the load
-- balancer picks; only the owner (the gateway running the response) can
-- abort its engine legs. The replica that got the cancel sets
-- `cancel_requested` on the row in flight and sends a NOTIFY on the
-- `smg_history_cancel` channel with the id; the owner LISTENs and cancels
-- at once, and also looks for requests of its own rows on every heartbeat
-- (a notice lost while its listening connection was down). The index on
-- in-flight rows by owner (0002) serves that look-up.

ALTER TABLE responses ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
