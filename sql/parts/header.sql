\echo Use "CREATE EXTENSION payidem" to load this file. \quit

/*
 * payidem -- schema (of the version payidem.control names).
 *
 * Money is bigint in the currency's minor unit; rates are numeric(7,6)
 * fractions.  Which statuses a row of "order", payment and refund may take is
 * enforced by the state-machine triggers at the end of each statement (PI002,
 * also for a status the whitelist payidem.state does not know), and only
 * there: no foreign key checks it a second time; the whitelist's own guard
 * keeps a status in use from being deleted.  Nothing is granted to PUBLIC.
 *
 * Order, payment and refund numbers carry ISO 7064 MOD 97-10 check digits
 * (see order_no_valid()).  The tables check them with built-in operators only,
 * so a role that may write a table needs no EXECUTE on a payidem function: the
 * prefix's letters read as two digits each (P=25, O=24, Y=34, R=27, F=15), and
 * the whole number is then 1 modulo 97.  (The CASE keeps the cast from seeing
 * anything but digits; a NULL passes, as in any CHECK.)
 */

