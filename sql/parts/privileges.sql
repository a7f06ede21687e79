------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  Grant to your application and operator
-- roles explicitly (see README, "Privileges").
------------------------------------------------------------------------------

REVOKE ALL ON ALL TABLES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA payidem FROM PUBLIC;
REVOKE ALL ON SCHEMA payidem FROM PUBLIC;

