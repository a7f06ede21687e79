------------------------------------------------------------------------------
-- Idempotency functions (C: src/idem.c)
------------------------------------------------------------------------------

-- Each runs its statements as the owner of payidem.idempotency (see
-- src/idem.c), so a role needs only EXECUTE on the function; none is PUBLIC.

CREATE FUNCTION payidem.idem_claim(idem_key text, biz_type text, order_no text,
                                   channel text, amount bigint,
                                   fingerprint text DEFAULT NULL,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
AS 'MODULE_PATHNAME', 'payidem_idem_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION payidem.idem_claim(text, text, text, text, bigint, text, interval) IS
	'Claim an idempotency key; the primary key decides. outcome: claimed (run the logic), in_progress (someone holds a live lease), replay (completed: answer with result), reclaimed (failed or lease expired: run the logic). PI001 if reused with other parameters.';

CREATE FUNCTION payidem.idem_finish(idem_key text, status text, result jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'payidem_idem_finish'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.idem_finish(text, text, jsonb) IS
	'Finish a processing key as completed (later claims replay result) or failed (the next claim reclaims it). PI009 unknown key, PI002 not processing.';

CREATE FUNCTION payidem.idem_record(idem_key text, biz_type text, order_no text,
                                    channel text, amount bigint, result jsonb,
                                    fingerprint text DEFAULT NULL)
RETURNS TABLE (outcome text, status text, result jsonb, attempts integer)
AS 'MODULE_PATHNAME', 'payidem_idem_record'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;
COMMENT ON FUNCTION payidem.idem_record(text, text, text, text, bigint, jsonb, text) IS
	'idem_claim() and idem_finish(key, ''completed'', result) in one write, when the business effect commits in the same transaction: claimed (the key is now completed with result: run the logic), replay, in_progress as for idem_claim(); a failed or expired key is reclaimed and completed at once (reclaimed). PI001 if reused with other parameters.';

CREATE FUNCTION payidem.idem_purge(older_than interval DEFAULT '24 hours')
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_idem_purge'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem.idem_purge(interval) IS
	'Delete completed and failed keys unchanged for longer than older_than; never a processing key. Returns the number deleted.';

CREATE FUNCTION payidem._idem_purge_batch(older_than interval, max_rows integer)
RETURNS bigint
AS 'MODULE_PATHNAME', 'payidem_idem_purge_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION payidem._idem_purge_batch(interval, integer) IS
	'Internal (housekeeping): idem_purge(older_than), at most max_rows keys, oldest first; keys another transaction holds are left for the next batch.';

-- (end of idempotency functions)

