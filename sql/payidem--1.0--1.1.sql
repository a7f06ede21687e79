-- payidem 1.0 -> 1.1 (ALTER EXTENSION payidem UPDATE TO '1.1').  Every change
-- made to sql/parts/ since 1.0, in the same words.
\echo Use "ALTER EXTENSION payidem UPDATE TO '1.1'" to load this file. \quit

-- observability: which version the loaded shared library is
CREATE FUNCTION payidem.library_version()
RETURNS text
AS 'MODULE_PATHNAME', 'payidem_library_version'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION payidem.library_version() IS
	'The version the loaded payidem library was built as; pg_extension.extversion is the version of the SQL objects, which ALTER EXTENSION payidem UPDATE brings up to it.';
REVOKE ALL ON FUNCTION payidem.library_version() FROM PUBLIC;
