-- JSON is kept as the gateway serialized it, as TEXT, not JSONB.
--
-- JSONB normalizes what it stores: an object's keys come back sorted by
-- length and then bytes, not in the order they were written. A stored
-- response is served back by GET, replayed into the next prompt (tool
-- call arguments, items) and compared by clients, so its key order is
-- part of what was stored. Nothing queries inside these columns, so JSONB
-- bought nothing. Rows written before this migration keep JSONB's order.

ALTER TABLE responses
    ALTER COLUMN input  TYPE TEXT USING input::text,
    ALTER COLUMN output TYPE TEXT USING output::text,
    ALTER COLUMN raw    TYPE TEXT USING raw::text;
ALTER TABLE conversations ALTER COLUMN metadata TYPE TEXT USING metadata::text;
ALTER TABLE conversation_items ALTER COLUMN item TYPE TEXT USING item::text;
