-- A cancel asked of one gateway for a response another gateway runs.
--
-- `POST /v1/responses/{id}/cancel` reaches whichever gateway serves the
-- call; only the owner (the gateway running the response) can abort its
-- engine legs. The gateway that got the cancel sets `cancel_requested` on
-- the row in flight; the owner looks for requests of its own rows on every
-- heartbeat (sqlite cannot push a notice). The index on in-flight rows by
-- owner (0002) serves that look-up.

ALTER TABLE responses ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
