/*-------------------------------------------------------------------------
 *
 * router.c
 *		The router's hot calls (payidem_router 1.1): gen_order_no(),
 *		get_order() and apply_payment_result() sent to their shard over
 *		libpq as statements the shard keeps prepared, and the routing
 *		decisions every router function takes (cluster_partitions(),
 *		check_partition(), partition_of()).
 *
 * The cluster is PL/Proxy's: server payidem, its options p0, p1, ... (one
 * connection string per partition) and the user mapping of the session
 * user, joined as PL/Proxy joins them (the partition's string, the
 * mapping's options, user=<session user> unless a user is named), so a
 * call made here reaches the same database as the same user as one made
 * through PL/Proxy.  Like PL/Proxy, each call runs on the shard in
 * autocommit: it is committed there when the shard answers, whatever the
 * router's transaction does next.
 *
 * Each backend keeps one connection per partition for these calls (beside
 * PL/Proxy's own for the other functions), made on first use and checked
 * before each call: a connection the shard closed while idle (a restart, a
 * terminated backend) is dropped and made again, not reported as a lost
 * call.  Each call's statement is prepared once per connection; what the
 * shard answers is the function's result, or its error raised here with
 * the shard's SQLSTATE, message, DETAIL and HINT.  A shard that cannot be
 * reached, or whose connection is lost during a call, is 08006 naming the
 * partition (router_shard_failure(), which the PL/Proxy functions' error
 * wrapper also calls, so both say it in the same words).
 *
 * A change of server payidem or of a user mapping (add_shards(), ALTER
 * SERVER, ALTER USER MAPPING) invalidates the cluster: the next call reads
 * it again and makes its connections anew.  The invalidation callback only
 * marks; connections are closed at the start of a call, never in the middle
 * of one.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <poll.h>

#include "libpq-fe.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_foreign_server.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "foreign/foreign.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "executor/spi.h"
#include "utils/guc.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "catalog.h"
#include "compat.h"
#include "inval.h"
#include "order_no_codec.h"
#include "util.h"

#define ROUTER_SERVER		"payidem"
#define ROUTER_MAX_ARGS		8
#define ROUTER_MAX_PARTS	256		/* (a number names 100 shards at most) */

/*
 * The calls made here, and how each is routed.  kind: the kind of number
 * its first argument is (partition_of()), NULL for any partition; place:
 * the outcome goes through payidem._place_transaction() (the transaction
 * id's placement for bills).
 */
typedef struct RouteSpec
{
	const char *name;
	const char *kind;
	bool		place;
} RouteSpec;

static const RouteSpec routes[] = {
	{"gen_order_no", NULL, false},
	{"get_order", "order", false},
	{"apply_payment_result", "payment", true},
};
#define N_ROUTES lengthof(routes)
/* (a connection's prepared statements are bits route and route + 16) */
StaticAssertDecl(lengthof(routes) <= 16, "at most 16 routes");

/* The kinds of number and their prefixes (partition_of()). */
static const struct
{
	const char *kind;
	const char *prefix;
}			number_kinds[] = {
	{"order", "PO"},
	{"payment", "PY"},
	{"refund", "RF"},
	{"payout", "PT"},
};

/* One partition's connection of this backend. */
typedef struct ShardConn
{
	PGconn	   *conn;
	uint32		prepared;		/* bit i: routes[i]'s statement is prepared
								 * (bit i + 16: its stored-form one) */
	bool		connecting;		/* being made */
	bool		same_encoding;	/* the shard's database has this one's encoding */
	bool		busy;			/* a call is between its send and its answer */
	PGresult   *res;			/* a result read while busy, not yet handed on */
} ShardConn;

static struct
{
	bool		loaded;			/* nparts read since the last invalidation */
	bool		stale;			/* invalidated: connections to be made again */
	Oid			userid;			/* session user the connections are made as */
	int			nparts;
	bool		callbacks;
	ShardConn	shards[ROUTER_MAX_PARTS];	/* never moved: a call holds one */
}			cluster;

/* What one API function of the router is, kept per function (fn_oid). */
typedef struct RouterCall
{
	MemoryContext cxt;			/* everything of this entry */
	uint32		hash;			/* of fn_oid in the PROCOID syscache */
	bool		stale;			/* the function changed: made again at the next call */
	int			in_use;			/* calls under way with it */
	Oid			fn_oid;
	int			route;
	int			nargs;
	Oid			paramtypes[ROUTER_MAX_ARGS];
	int			formats[ROUTER_MAX_ARGS];	/* 1: binary */
	FmgrInfo	out[ROUTER_MAX_ARGS];
	Oid			rettype;
	FmgrInfo	in;
	Oid			ioparam;
	int			retformat;
	char	   *sql;
	char		stmt[NAMEDATALEN + 16];
	/* a jsonb result in its stored form (shards of the router's encoding) */
	bool		stored;
	char	   *sql_stored;
	char		stmt_stored[NAMEDATALEN + 24];
} RouterCall;

static RouterCall *calls[N_ROUTES];

/* ----------------------------------------------------------------
 * Invalidation
 * ---------------------------------------------------------------- */

static void
router_cluster_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	cluster.loaded = false;
	cluster.stale = true;
}

static void
router_proc_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	int			i;

	/* only marked: a call may be using it (router_call_of() frees it) */
	for (i = 0; i < N_ROUTES; i++)
		if (calls[i] && (hashvalue == 0 || calls[i]->hash == hashvalue))
			calls[i]->stale = true;
}

static void
register_callbacks(void)
{
	if (cluster.callbacks)
		return;
	payidem_register_syscache_callback(FOREIGNSERVEROID, router_cluster_callback, (Datum) 0);
	payidem_register_syscache_callback(USERMAPPINGOID, router_cluster_callback, (Datum) 0);
	payidem_register_syscache_callback(PROCOID, router_proc_callback, (Datum) 0);
	cluster.callbacks = true;
}

/* ----------------------------------------------------------------
 * The cluster
 * ---------------------------------------------------------------- */

/* the partition number of option name p<digits>, or -1 */
static int
partition_option(const char *name)
{
	const char *s;

	if (name[0] != 'p' || name[1] == '\0')
		return -1;
	for (s = name + 1; *s; s++)
		if (*s < '0' || *s > '9')
			return -1;
	return atoi(name + 1);
}

static void
drop_connections(void)
{
	int			i;

	for (i = 0; i < ROUTER_MAX_PARTS; i++)
	{
		if (cluster.shards[i].conn)
			PQfinish(cluster.shards[i].conn);
		cluster.shards[i].conn = NULL;
		cluster.shards[i].prepared = 0;
		cluster.shards[i].busy = false;
		cluster.shards[i].connecting = false;
	}
}

/*
 * The number of partitions of server payidem (0 if there is no such
 * server), read again after an invalidation.  For a call: the connections
 * of a cluster invalidated since, or made as another session user, are
 * closed first (only here, at the start of a call).
 */
static int
cluster_load(bool for_call)
{
	ForeignServer *server;
	ListCell   *lc;
	int			n = 0;

	register_callbacks();
	if (for_call && (cluster.stale || cluster.userid != GetSessionUserId()))
	{
		drop_connections();
		cluster.stale = false;
		cluster.userid = GetSessionUserId();
	}
	if (cluster.loaded)
		return cluster.nparts;

	server = GetForeignServerByName(ROUTER_SERVER, true);
	if (server != NULL)
		foreach(lc, server->options)
			if (partition_option(((DefElem *) lfirst(lc))->defname) >= 0)
				n++;
	if (n > ROUTER_MAX_PARTS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("server payidem has %d partitions, more than the router serves", n),
				 errdetail("The router serves at most %d partitions.", ROUTER_MAX_PARTS)));
	cluster.nparts = n;
	cluster.loaded = true;
	return n;
}

static void
refuse_no_cluster(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the PL/Proxy cluster payidem is not defined"),
			 errhint("CREATE SERVER payidem FOREIGN DATA WRAPPER plproxy OPTIONS (p0 '...', p1 '...'), see docs/scale-out.md.")));
}

/* check_partition(): the partition itself if the cluster has it */
static int
check_partition(int partition, bool isnull)
{
	int			n = cluster_load(false);

	if (n == 0)
		refuse_no_cluster();
	if (isnull || partition < 0 || partition >= n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("partition %s does not exist", isnull ? "NULL" : psprintf("%d", partition)),
				 errdetail("The cluster has %d partitions, 0 to %d.", n, n - 1)));
	return partition;
}

/*
 * partition_of(): the partition holding a number of a kind -- the shard
 * its digits name, if it is a valid number of that kind and the cluster
 * has that shard; 0 otherwise (a number the cluster cannot place goes to
 * partition 0, which refuses it in the words of one database: a mistyped
 * shard digit must not reach another shard).
 */
static int
partition_of(const char *number, size_t len, const char *kind)
{
	const char *prefix = NULL;
	OrderNoParts parts;
	int			i;

	for (i = 0; i < lengthof(number_kinds); i++)
		if (kind && strcmp(kind, number_kinds[i].kind) == 0)
			prefix = number_kinds[i].prefix;
	if (prefix == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown kind of number %s", kind ? quote_literal_cstr(kind) : "NULL"),
				 errhint("The kinds are order, payment, refund and payout.")));
	if (number == NULL || len < 2 || memcmp(number, prefix, 2) != 0 ||
		order_no_parse(number, len, &parts) != ORDER_NO_OK)
		return 0;
	if (parts.shard >= cluster_load(false))
		return 0;
	return parts.shard;
}

/* ----------------------------------------------------------------
 * A shard that cannot be reached or was lost
 * ---------------------------------------------------------------- */

typedef struct ShardFailure
{
	char	   *message;
	char	   *detail;
	const char *hint;
} ShardFailure;

/*
 * The words of 08006: a shard that cannot be reached (lost = false) or
 * whose connection was lost during a call, its partition (-1: not known)
 * and database, and what libpq or the shard said (its whitespace folded).
 */
static ShardFailure
shard_failure(bool lost, int partition, const char *database, const char *reason)
{
	ShardFailure f;
	char	   *shard;
	StringInfoData r;
	const char *s;
	bool		space = false;

	shard = partition >= 0 ? psprintf("%d (database \"%s\")", partition, database ? database : "")
		: psprintf("(database \"%s\")", database ? database : "");
	initStringInfo(&r);
	for (s = reason ? reason : ""; *s; s++)
	{
		if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
			space = r.len > 0;
		else
		{
			if (space)
				appendStringInfoChar(&r, ' ');
			appendStringInfoChar(&r, *s);
			space = false;
		}
	}
	f.detail = r.len > 0 ? r.data : NULL;
	if (lost)
	{
		f.message = psprintf("the connection to shard %s was lost during the call", shard);
		f.hint = "The call may have been applied on that shard: repeat it once the shard is back (payidem's calls are idempotent). payidem.cluster_check() shows every partition.";
	}
	else
	{
		f.message = psprintf("shard %s cannot be reached", shard);
		f.hint = "Start that shard's server, or correct its connection in server payidem; payidem.cluster_check() shows every partition. Calls routed to the other shards go on working.";
	}
	return f;
}

static void
raise_shard_failure(bool lost, int partition, PGconn *conn, const char *reason)
{
	ShardFailure f = shard_failure(lost, partition, conn ? PQdb(conn) : NULL, reason);

	ereport(ERROR,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg_internal("%s", f.message),
			 f.detail ? errdetail_internal("%s", f.detail) : 0,
			 errhint("%s", f.hint)));
}

/* ----------------------------------------------------------------
 * Connections
 * ---------------------------------------------------------------- */

static void
append_conninfo_value(StringInfo buf, const char *key, const char *value)
{
	const char *s;

	appendStringInfo(buf, " %s='", key);
	for (s = value; *s; s++)
	{
		if (*s == '\'' || *s == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *s);
	}
	appendStringInfoChar(buf, '\'');
}

/* the connection string of partition p for the session user, as PL/Proxy makes it */
static char *
partition_connstr(int p)
{
	ForeignServer *server = GetForeignServerByName(ROUTER_SERVER, false);
	UserMapping *um;
	Oid			userid = GetSessionUserId();
	AclResult	acl;
	StringInfoData buf;
	ListCell   *lc;
	const char *base = NULL;

	acl = ForeignServerAclCheckCompat(server->serverid, userid, ACL_USAGE);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_FOREIGN_SERVER, server->servername);
	foreach(lc, server->options)
	{
		DefElem    *d = lfirst(lc);

		if (partition_option(d->defname) == p)
			base = strVal(d->arg);
	}
	if (base == NULL)
		elog(ERROR, "server payidem has no option p%d", p);
	um = GetUserMapping(userid, server->serverid);
	initStringInfo(&buf);
	appendStringInfoString(&buf, base);
	foreach(lc, um->options)
	{
		DefElem    *d = lfirst(lc);

		append_conninfo_value(&buf, d->defname, strVal(d->arg));
	}
	if (strstr(buf.data, "user=") == NULL)
		append_conninfo_value(&buf, "user", GetUserNameFromId(userid, false));
	/* the shard converts to and from this database's encoding */
	append_conninfo_value(&buf, "client_encoding", GetDatabaseEncodingName());
	return buf.data;
}

/*
 * Wait until conn's socket is readable or writable (or the latch is set,
 * interrupts served); false if timeout_ms (>= 0) passed first.
 */
static bool
wait_socket(PGconn *conn, bool write, long timeout_ms)
{
	int			rc;

	rc = WaitLatchOrSocket(MyLatch,
						   WL_LATCH_SET | WL_EXIT_ON_PM_DEATH |
						   (write ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE) |
						   (timeout_ms >= 0 ? WL_TIMEOUT : 0),
						   PQsocket(conn), timeout_ms, PG_WAIT_EXTENSION);
	if (rc & WL_LATCH_SET)
	{
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return !(rc & WL_TIMEOUT) || (rc & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE));
}

/* the connection's connect_timeout in milliseconds, -1 if none */
static long
connect_timeout_ms(PGconn *conn)
{
	PQconninfoOption *opts = PQconninfo(conn);
	PQconninfoOption *o;
	long		ms = -1;

	for (o = opts; o && o->keyword; o++)
		if (strcmp(o->keyword, "connect_timeout") == 0 && o->val && atoi(o->val) > 0)
			ms = Max(atoi(o->val), 2) * 1000L;
	PQconninfoFree(opts);
	return ms;
}

/* a shard's WARNING during a call reaches the client as the shard gave it */
static void
relay_notice(void *arg, const PGresult *res)
{
	const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	const char *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
	const char *hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);

	/* (interrupts are held while libpq reads: this returns to it) */
	if (severity == NULL || strcmp(severity, "WARNING") != 0 || message == NULL)
		return;
	ereport(WARNING,
			(state && strlen(state) == 5 ? errcode(MAKE_SQLSTATE(state[0], state[1], state[2], state[3], state[4])) : 0,
			 errmsg_internal("%s", message),
			 detail && *detail ? errdetail_internal("%s", detail) : 0,
			 hint && *hint ? errhint("%s", hint) : 0));
}

static void
shard_connect(ShardConn *sc, int p)
{
	char	   *connstr = partition_connstr(p);
	PostgresPollingStatusType st = PGRES_POLLING_WRITING;
	long		timeout;

	sc->conn = PQconnectStart(connstr);
	sc->prepared = 0;
	if (sc->conn == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	sc->connecting = true;
	if (PQstatus(sc->conn) == CONNECTION_BAD)
		raise_shard_failure(false, p, sc->conn, PQerrorMessage(sc->conn));
	timeout = connect_timeout_ms(sc->conn);
	while (st != PGRES_POLLING_OK)
	{
		if (st == PGRES_POLLING_FAILED)
			raise_shard_failure(false, p, sc->conn, PQerrorMessage(sc->conn));
		if (!wait_socket(sc->conn, st == PGRES_POLLING_WRITING, timeout))
			raise_shard_failure(false, p, sc->conn, "timeout expired");
		st = PQconnectPoll(sc->conn);
	}
	PQsetNoticeReceiver(sc->conn, relay_notice, NULL);
	/* libpq's own messages name no statement or context of the shard */
	PQsetErrorVerbosity(sc->conn, PQERRORS_TERSE);
	{
		const char *enc = PQparameterStatus(sc->conn, "server_encoding");

		sc->same_encoding = enc && strcmp(enc, GetDatabaseEncodingName()) == 0;
	}
	sc->connecting = false;
}

/*
 * A connection fit for the next call: open, idle, and with nothing to read.
 * An idle connection is sent nothing by its shard but the notice that it
 * is closing it (a shutdown, a terminated backend), so one with anything
 * to read is dropped and made again rather than used.
 */
static bool
conn_usable(PGconn *conn)
{
	struct pollfd pfd;

	if (PQstatus(conn) != CONNECTION_OK || PQtransactionStatus(conn) != PQTRANS_IDLE)
		return false;
	pfd.fd = PQsocket(conn);
	pfd.events = POLLIN;
	pfd.revents = 0;
	return poll(&pfd, 1, 0) == 0;
}

static ShardConn *
shard_conn(int p)
{
	ShardConn  *sc = &cluster.shards[p];

	if (sc->conn && !conn_usable(sc->conn))
	{
		PQfinish(sc->conn);
		sc->conn = NULL;
	}
	if (sc->conn == NULL)
		shard_connect(sc, p);
	return sc;
}

/*
 * Wait for the answer to what was sent on sc and return it (the last
 * result; errors are results too).  A connection that fails meanwhile is a
 * lost call, told in the words of the shard's last error if it sent one
 * (a terminated backend's FATAL), else libpq's.  Interrupts are served
 * only while waiting: libpq reads (and hands a WARNING to relay_notice())
 * with them held.
 */
static PGresult *
shard_answer(ShardConn *sc, int p)
{
	PGresult   *res;
	bool		failed = false;

	Assert(sc->res == NULL);
	for (;;)
	{
		bool		busy;

		HOLD_INTERRUPTS();
		busy = PQisBusy(sc->conn);
		RESUME_INTERRUPTS();
		while (busy && !failed)
		{
			wait_socket(sc->conn, false, -1);
			HOLD_INTERRUPTS();
			failed = !PQconsumeInput(sc->conn);
			busy = PQisBusy(sc->conn);
			RESUME_INTERRUPTS();
		}
		HOLD_INTERRUPTS();
		res = PQgetResult(sc->conn);
		RESUME_INTERRUPTS();
		if (res == NULL)
			break;
		if (sc->res)
			PQclear(sc->res);
		sc->res = res;
		if (failed && PQstatus(sc->conn) == CONNECTION_BAD)
			break;
	}
	res = sc->res;
	sc->res = NULL;
	if (failed || res == NULL || PQstatus(sc->conn) != CONNECTION_OK)
	{
		const char *f = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
		char	   *reason = pstrdup(f ? f : PQerrorMessage(sc->conn));

		/*
		 * Without the shard's own error (libpq drops it when the connection
		 * ends after it): its first line, tersely "SEVERITY:  message", is
		 * what the shard said.
		 */
		if (f == NULL)
		{
			char	   *nl = strchr(reason, '\n');
			char	   *sep = strstr(reason, ":  ");

			if (nl)
				*nl = '\0';
			if (sep && (nl == NULL || sep < nl))
				reason = sep + 3;
		}

		if (res)
			PQclear(res);
		raise_shard_failure(true, p, sc->conn, reason);
	}
	return res;
}

/*
 * Raise the shard's error in res as the shard raised it (a shard that ended
 * the session, 57P0x, lost the call), after freeing res.
 */
static void
raise_remote_error(PGresult *res, ShardConn *sc, int p)
{
	const char *f;
	char	   *state,
			   *message,
			   *detail,
			   *hint;

	f = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	state = pstrdup(f && strlen(f) == 5 ? f : "XX000");
	f = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	message = pstrdup(f ? f : PQresultErrorMessage(res));
	f = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
	detail = f && *f ? pstrdup(f) : NULL;
	f = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
	hint = f && *f ? pstrdup(f) : NULL;
	PQclear(res);
	if (strncmp(state, "57P0", 4) == 0)
		raise_shard_failure(true, p, sc->conn, message);
	ereport(ERROR,
			(errcode(MAKE_SQLSTATE(state[0], state[1], state[2], state[3], state[4])),
			 errmsg_internal("%s", message),
			 detail ? errdetail_internal("%s", detail) : 0,
			 hint ? errhint("%s", hint) : 0));
}

/* ----------------------------------------------------------------
 * A jsonb document in its stored form
 * ---------------------------------------------------------------- */

/*
 * The stored form of a numeric (numeric.c's, the same in every major): a
 * 4-byte varlena header, then a 16-bit header -- short form (flag 0x8000:
 * sign, display scale and weight in it) or long form (sign and display
 * scale, then a 16-bit weight) -- then base-10000 digits, none of them 0 at
 * either end.  NaN and the infinities (0xC000) are no JSON number.
 */
#define STORED_NUMERIC_SIGN_MASK	0xC000
#define STORED_NUMERIC_NEG			0x4000
#define STORED_NUMERIC_SHORT		0x8000
#define STORED_NUMERIC_SPECIAL		0xC000
#define STORED_NUMERIC_SHORT_SIGN	0x2000
#define STORED_NUMERIC_SHORT_WEIGHT	0x007F
#define STORED_NUMERIC_SHORT_WEIGHT_SIGN 0x0040
#define STORED_NUMERIC_SHORT_DSCALE	0x1F80
#define STORED_NUMERIC_SHORT_DSCALE_SHIFT 7
#define STORED_NUMERIC_DSCALE		0x3FFF
#define STORED_NUMERIC_NBASE		10000

static bool
numeric_form_valid(const char *v, uint32 len)
{
	uint16		header;
	uint32		hdrlen;
	uint32		ndigits;
	uint32		i;
	int16		digit = 0;
	int			weight;
	int			dscale;

	if (len < VARHDRSZ + sizeof(uint16) || !VARATT_IS_4B_U(v) || VARSIZE_4B(v) != len)
		return false;
	memcpy(&header, v + VARHDRSZ, sizeof(uint16));
	switch (header & STORED_NUMERIC_SIGN_MASK)
	{
		case STORED_NUMERIC_SPECIAL:
			return false;
		case STORED_NUMERIC_SHORT:
			hdrlen = VARHDRSZ + sizeof(uint16);
			break;
		default:
			hdrlen = VARHDRSZ + sizeof(uint16) + sizeof(int16);
			break;
	}
	if (len < hdrlen || (len - hdrlen) % sizeof(int16) != 0)
		return false;
	ndigits = (len - hdrlen) / sizeof(int16);
	for (i = 0; i < ndigits; i++)
	{
		memcpy(&digit, v + hdrlen + i * sizeof(int16), sizeof(int16));
		if (digit < 0 || digit >= STORED_NUMERIC_NBASE || ((i == 0 || i == ndigits - 1) && digit == 0))
			return false;
	}
	if ((header & STORED_NUMERIC_SIGN_MASK) == STORED_NUMERIC_SHORT)
	{
		dscale = (header & STORED_NUMERIC_SHORT_DSCALE) >> STORED_NUMERIC_SHORT_DSCALE_SHIFT;
		weight = (header & STORED_NUMERIC_SHORT_WEIGHT_SIGN) ?
			(int) (header & (STORED_NUMERIC_SHORT_WEIGHT_SIGN - 1)) - STORED_NUMERIC_SHORT_WEIGHT_SIGN :
			(int) (header & (STORED_NUMERIC_SHORT_WEIGHT_SIGN - 1));
	}
	else
	{
		int16		w;

		memcpy(&w, v + VARHDRSZ + sizeof(uint16), sizeof(int16));
		dscale = header & STORED_NUMERIC_DSCALE;
		weight = w;
	}
	/* the display scale shows every decimal its digits hold (numeric_recv's rule) */
	if (ndigits > 0 && (int) ndigits - 1 > weight)
	{
		int			needed = ((int) ndigits - 1 - weight) * 4;

		while (digit % 10 == 0)		/* (the last digit: never 0) */
		{
			digit /= 10;
			needed--;
		}
		if (dscale < needed)
			return false;
	}
	if (ndigits == 0)
	{
		/* zero: positive, weight 0 */
		int16		weight = 0;

		if ((header & STORED_NUMERIC_SIGN_MASK) == STORED_NUMERIC_SHORT)
		{
			if (header & (STORED_NUMERIC_SHORT_SIGN | STORED_NUMERIC_SHORT_WEIGHT))
				return false;
		}
		else
		{
			memcpy(&weight, v + VARHDRSZ + sizeof(uint16), sizeof(int16));
			if ((header & STORED_NUMERIC_SIGN_MASK) == STORED_NUMERIC_NEG || weight != 0)
				return false;
		}
	}
	return true;
}

/*
 * Whether len bytes at c are a well-formed jsonb container (nested: an
 * object or an array; at the root also a scalar): every child within its
 * container, of a known type, a string valid in the database encoding, a
 * number a numeric of its stated size, an object's keys strings in jsonb's
 * order (shorter first, then by bytes) with none twice.  What the router
 * takes from a shard without parsing is checked so, so a malformed answer
 * is refused, never read past its end.
 */
static bool
jsonb_form_valid(const char *c, uint32 len, bool root)
{
	uint32		header;
	uint32		count;
	uint32		nentries;
	const char *data;
	uint32		datalen;
	uint32		end = 0;
	uint32		i;
	const char *prevkey = NULL;
	uint32		prevkeylen = 0;

	check_stack_depth();
	if (len < sizeof(uint32))
		return false;
	memcpy(&header, c, sizeof(uint32));
	count = header & JB_CMASK;
	if ((header & JB_FOBJECT) && (header & (JB_FARRAY | JB_FSCALAR)))
		return false;
	if (!(header & (JB_FOBJECT | JB_FARRAY)))
		return false;
	if ((header & JB_FSCALAR) && (!root || count != 1))
		return false;
	nentries = (header & JB_FOBJECT) ? count * 2 : count;
	if (nentries > (len - sizeof(uint32)) / sizeof(JEntry))
		return false;
	data = c + sizeof(uint32) + nentries * sizeof(JEntry);
	datalen = len - sizeof(uint32) - nentries * sizeof(JEntry);
	for (i = 0; i < nentries; i++)
	{
		JEntry		je;
		uint32		start = end;
		uint32		clen;
		const char *v;

		memcpy(&je, c + sizeof(uint32) + i * sizeof(JEntry), sizeof(JEntry));
		end = JBE_HAS_OFF(je) ? JBE_OFFLENFLD(je) : start + JBE_OFFLENFLD(je);
		if (end < start || end > datalen)
			return false;
		clen = end - start;
		v = data + start;
		switch (je & JENTRY_TYPEMASK)
		{
			case JENTRY_ISSTRING:
				if (pg_encoding_verifymbstr(GetDatabaseEncoding(), v, clen) != clen)
					return false;
				if ((header & JB_FOBJECT) && i < count)
				{
					if (prevkey && (clen < prevkeylen ||
									(clen == prevkeylen && memcmp(v, prevkey, clen) <= 0)))
						return false;
					prevkey = v;
					prevkeylen = clen;
				}
				break;
			case JENTRY_ISNUMERIC:
			case JENTRY_ISCONTAINER:
				{
					uint32		pad = INTALIGN(start) - start;

					if ((header & JB_FOBJECT) && i < count)
						return false;
					/* (a root scalar is a scalar) */
					if ((header & JB_FSCALAR) && (je & JENTRY_TYPEMASK) == JENTRY_ISCONTAINER)
						return false;
					if (pad > clen)
						return false;
					v += pad;
					clen -= pad;
					if ((je & JENTRY_TYPEMASK) == JENTRY_ISCONTAINER)
					{
						if (!jsonb_form_valid(v, clen, false))
							return false;
					}
					else if (!numeric_form_valid(v, clen))
						return false;
				}
				break;
			case JENTRY_ISBOOL_FALSE:
			case JENTRY_ISBOOL_TRUE:
			case JENTRY_ISNULL:
				if (clen != 0 || ((header & JB_FOBJECT) && i < count))
					return false;
				break;
			default:
				return false;
		}
	}
	return true;
}

/* a jsonb datum of the stored form in bytes[0..len-1], refused if malformed */
static Datum
jsonb_from_form(const char *bytes, int len, int p)
{
	Jsonb	   *j;

	if (len < 0 || !jsonb_form_valid(bytes, (uint32) len, true))
		ereport(ERROR,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("shard %d answered with a malformed jsonb document", p),
				 errhint("The shard's payidem must be the router's version or later.")));
	j = palloc(VARHDRSZ + len);
	SET_VARSIZE(j, VARHDRSZ + len);
	memcpy(VARDATA(j), bytes, len);
	return JsonbPGetDatum(j);
}

/* ----------------------------------------------------------------
 * The calls
 * ---------------------------------------------------------------- */

/* a parameter sent in binary: types whose binary form does not depend on settings or encodings */
static bool
binary_type(Oid type)
{
	switch (type)
	{
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case BOOLOID:
		case DATEOID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
			return true;
		default:
			return false;
	}
}

static RouterCall *
router_call_of(FunctionCallInfo fcinfo)
{
	Oid			fn_oid = fcinfo->flinfo->fn_oid;
	HeapTuple	tup;
	Form_pg_proc proc;
	RouterCall *c;
	MemoryContext old;
	StringInfoData sql;
	int			route = -1;
	int			i;

	for (i = 0; i < N_ROUTES; i++)
	{
		if (calls[i] && calls[i]->stale)
		{
			/* (one still in use by a call under way is left to it) */
			if (calls[i]->in_use == 0)
				MemoryContextDelete(calls[i]->cxt);
			calls[i] = NULL;
		}
		if (calls[i] && calls[i]->fn_oid == fn_oid)
			return calls[i];
	}

	register_callbacks();
	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn_oid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", fn_oid);
	proc = (Form_pg_proc) GETSTRUCT(tup);
	for (i = 0; i < N_ROUTES; i++)
		if (strcmp(NameStr(proc->proname), routes[i].name) == 0)
			route = i;
	if (route < 0 || proc->pronargs > ROUTER_MAX_ARGS || proc->proretset ||
		strcmp(get_namespace_name(proc->pronamespace), "payidem") != 0)
		elog(ERROR, "payidem's router call does not serve function %s", NameStr(proc->proname));

	{
		MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "payidem router call",
												  ALLOCSET_SMALL_SIZES);

		old = MemoryContextSwitchTo(cxt);
		c = palloc0(sizeof(RouterCall));
		c->cxt = cxt;
	}
	c->hash = GetSysCacheHashValue1(PROCOID, ObjectIdGetDatum(fn_oid));
	c->fn_oid = fn_oid;
	c->route = route;
	c->nargs = proc->pronargs;
	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT payidem.%s(", routes[route].name);
	for (i = 0; i < c->nargs; i++)
	{
		Oid			type = proc->proargtypes.values[i];
		Oid			func;
		bool		varlena;

		c->paramtypes[i] = type < FirstGenbkiObjectId ? type : InvalidOid;
		c->formats[i] = binary_type(type) ? 1 : 0;
		if (c->formats[i])
			getTypeBinaryOutputInfo(type, &func, &varlena);
		else
			getTypeOutputInfo(type, &func, &varlena);
		fmgr_info_cxt(func, &c->out[i], c->cxt);
		appendStringInfo(&sql, "%s$%d", i > 0 ? ", " : "", i + 1);
	}
	appendStringInfoChar(&sql, ')');
	c->sql = sql.data;
	snprintf(c->stmt, sizeof(c->stmt), "payidem_router_%s", routes[route].name);
	c->rettype = proc->prorettype;
	c->retformat = binary_type(c->rettype) ? 1 : 0;
	c->stored = c->rettype == JSONBOID;
	if (c->stored)
	{
		/*
		 * A document comes in its stored form, not printed and parsed again,
		 * from a shard whose database has this one's encoding (its strings
		 * are not converted); from another, as text.
		 */
		c->sql_stored = psprintf("SELECT payidem._jsonb_stored(%s)", c->sql + strlen("SELECT "));
		snprintf(c->stmt_stored, sizeof(c->stmt_stored), "payidem_router_%s_stored", routes[route].name);
	}
	{
		Oid			func;

		if (c->retformat)
			getTypeBinaryInputInfo(c->rettype, &func, &c->ioparam);
		else
			getTypeInputInfo(c->rettype, &func, &c->ioparam);
		fmgr_info_cxt(func, &c->in, c->cxt);
	}
	MemoryContextSwitchTo(old);
	ReleaseSysCache(tup);
	calls[route] = c;
	return c;
}

/* the call's partition: its number's (22023/55000 as check_partition()), or any */
static int
call_partition(RouterCall *c, FunctionCallInfo fcinfo)
{
	int			n = cluster_load(true);

	if (routes[c->route].kind == NULL)
	{
		if (n == 0)
			refuse_no_cluster();
		return (int) pg_prng_uint64_range(&pg_global_prng_state, 0, n - 1);
	}
	if (PG_ARGISNULL(0))
		return check_partition(partition_of(NULL, 0, routes[c->route].kind), false);
	else
	{
		text	   *number = PG_GETARG_TEXT_PP(0);

		return check_partition(partition_of(VARDATA_ANY(number), VARSIZE_ANY_EXHDR(number),
											routes[c->route].kind), false);
	}
}

static pg_noinline Datum
call_on_shard(RouterCall *c, FunctionCallInfo fcinfo, int p, bool *isnull)
{
	ShardConn  *sc = shard_conn(p);
	const char *values[ROUTER_MAX_ARGS];
	int			lengths[ROUTER_MAX_ARGS];
	bool		stored = c->stored && sc->same_encoding;
	uint32		bit = UINT32_C(1) << (c->route + (stored ? 16 : 0));
	const char *stmt = stored ? c->stmt_stored : c->stmt;
	PGresult   *res;
	volatile Datum result = (Datum) 0;
	int			i;

	for (i = 0; i < c->nargs; i++)
	{
		values[i] = NULL;
		lengths[i] = 0;
		if (fcinfo->args[i].isnull)
			continue;
		if (c->formats[i])
		{
			bytea	   *b = SendFunctionCall(&c->out[i], fcinfo->args[i].value);

			values[i] = VARDATA(b);
			lengths[i] = VARSIZE(b) - VARHDRSZ;
		}
		else
			values[i] = OutputFunctionCall(&c->out[i], fcinfo->args[i].value);
	}

	sc->busy = true;
	if (!(sc->prepared & bit))
	{
		if (!PQsendPrepare(sc->conn, stmt, stored ? c->sql_stored : c->sql, c->nargs, c->paramtypes))
			raise_shard_failure(true, p, sc->conn, PQerrorMessage(sc->conn));
		res = shard_answer(sc, p);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			sc->busy = false;
			raise_remote_error(res, sc, p);
		}
		PQclear(res);
		sc->prepared |= bit;
	}
	if (!PQsendQueryPrepared(sc->conn, stmt, c->nargs, values, lengths, c->formats, stored ? 1 : c->retformat))
		raise_shard_failure(true, p, sc->conn, PQerrorMessage(sc->conn));
	res = shard_answer(sc, p);
	sc->busy = false;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		raise_remote_error(res, sc, p);
	if (PQntuples(res) != 1 || PQnfields(res) != 1)
	{
		PQclear(res);
		elog(ERROR, "shard %d answered %s with other than one value", p, routes[c->route].name);
	}
	*isnull = PQgetisnull(res, 0, 0);
	PG_TRY();
	{
		if (*isnull)
			;
		else if (stored)
			result = jsonb_from_form(PQgetvalue(res, 0, 0), PQgetlength(res, 0, 0), p);
		else if (c->retformat)
		{
			StringInfoData buf;

			initStringInfo(&buf);
			appendBinaryStringInfo(&buf, PQgetvalue(res, 0, 0), PQgetlength(res, 0, 0));
			result = ReceiveFunctionCall(&c->in, &buf, c->ioparam, -1);
		}
		else
			result = InputFunctionCall(&c->in, PQgetvalue(res, 0, 0), c->ioparam, -1);
	}
	PG_FINALLY();
	{
		PQclear(res);
	}
	PG_END_TRY();
	return result;
}

/*
 * The placement of a success's transaction id (payidem.transaction_placement):
 * where a channel's bill line that does not carry our payment number is
 * sent.  A success reported with a transaction id, whatever the shard made
 * of it (applied, duplicate, anomaly), places that id on the payment's
 * partition; a first placement is kept (a repeat, or the same id reported
 * for another payment, changes nothing: ON CONFLICT DO NOTHING, whose
 * check is the one index probe a repeat costs).  Made after the shard has
 * answered, so no lock is held across the call; as the table's owner (the
 * application may not write it).  A placement is a routing hint for bills,
 * not money: the router's commit of a new one does not wait for its WAL
 * flush (synchronous_commit off for that transaction).  A router that
 * crashes may lose the last few; their bill lines then go to partition 0
 * and show as differences there.
 */
static SPIPlanPtr place_plan;

static void
place_transaction(text *outcome, int partition, text *status, text *transaction_id)
{
	Oid			nsp;
	Oid			relid;
	HeapTuple	tup;
	Oid			owner;
	PayidemAsOwner save;
	Datum		values[2];
	int			rc;

	if (status == NULL || outcome == NULL || transaction_id == NULL ||
		!payidem_text_is(PointerGetDatum(status), "succeeded") ||
		!(payidem_text_is(PointerGetDatum(outcome), "applied") ||
		  payidem_text_is(PointerGetDatum(outcome), "duplicate") ||
		  payidem_text_is(PointerGetDatum(outcome), "anomaly")))
		return;
	nsp = get_namespace_oid("payidem", false);
	relid = get_relname_relid("transaction_placement", nsp);
	if (!OidIsValid(relid))
		elog(ERROR, "payidem.transaction_placement does not exist");
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);

	values[0] = PointerGetDatum(transaction_id);
	values[1] = Int32GetDatum(partition);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (place_plan == NULL)
	{
		Oid			types[2] = {TEXTOID, INT4OID};
		SPIPlanPtr	plan;

		plan = SPI_prepare_cursor("INSERT INTO payidem.transaction_placement (transaction_id, partition) "
								  "VALUES ($1, $2) ON CONFLICT DO NOTHING",
								  2, types, CURSOR_OPT_GENERIC_PLAN);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		place_plan = plan;
	}
	payidem_become_owner(owner, 0, &save);
	rc = SPI_execute_plan(place_plan, values, NULL, false, 0);
	payidem_become_caller(&save);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "placing a transaction failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		(void) set_config_option("synchronous_commit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
	SPI_finish();
}

/*
 * Ask the shard to cancel the statement in flight on conn.  With libpq 17
 * on, without blocking, waiting at most five seconds for the shard to take
 * the request.  An older libpq has only PQcancel(), which waits for the
 * shard's postmaster to take it with no limit of its own, as PL/Proxy's
 * cancel does: a call cut off while its shard has stopped answering
 * altogether (a frozen host) waits for it (docs/scale-out.md).
 */
static void
cancel_call(PGconn *conn)
{
#ifdef LIBPQ_HAS_ASYNC_CANCEL
	PGcancelConn *cc = PQcancelCreate(conn);
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 5000);

	if (cc != NULL && PQcancelStart(cc))
	{
		PostgresPollingStatusType st = PGRES_POLLING_WRITING;

		while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED)
		{
			long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

			if (left <= 0)
				break;
			(void) WaitLatchOrSocket(NULL,
									 WL_EXIT_ON_PM_DEATH | WL_TIMEOUT |
									 (st == PGRES_POLLING_WRITING ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE),
									 PQcancelSocket(cc), left, PG_WAIT_EXTENSION);
			st = PQcancelPoll(cc);
		}
	}
	if (cc != NULL)
		PQcancelFinish(cc);
#else
	PGcancel   *cancel = PQgetCancel(conn);
	char		errbuf[256];

	if (cancel)
	{
		PQcancel(cancel, errbuf, sizeof(errbuf));
		PQfreeCancel(cancel);
	}
#endif
}

/*
 * call_on_shard(), and a call cut off between its send and its answer (an
 * interrupt, a cancel, a timeout) takes its connection with it: the shard
 * is told to cancel, and the next call connects again.
 */
static pg_noinline Datum
call_on_shard_guarded(RouterCall *c, FunctionCallInfo fcinfo, int p, bool *isnull)
{
	ShardConn  *sc = &cluster.shards[p];
	volatile Datum result = (Datum) 0;

	c->in_use++;
	PG_TRY();
	{
		result = call_on_shard(c, fcinfo, p, isnull);
	}
	PG_CATCH();
	{
		c->in_use--;
		if (sc->res)
			PQclear(sc->res);
		sc->res = NULL;
		if (sc->conn && (sc->busy || sc->connecting))
		{
			/* a connection being made is only closed: its shard may not answer */
			if (sc->busy && !sc->connecting)
				cancel_call(sc->conn);
			PQfinish(sc->conn);
			sc->conn = NULL;
			sc->prepared = 0;
		}
		sc->busy = false;
		sc->connecting = false;
		PG_RE_THROW();
	}
	PG_END_TRY();
	c->in_use--;
	return result;
}

/*
 * payidem_router_call
 *		The body of the router's gen_order_no(), get_order() and
 *		apply_payment_result(): the same function called on its shard
 *		(apply_payment_result's outcome through _place_transaction(), as
 *		the PL/Proxy version's wrapper did).
 */
PG_FUNCTION_INFO_V1(payidem_router_call);
Datum
payidem_router_call(PG_FUNCTION_ARGS)
{
	RouterCall *c = router_call_of(fcinfo);
	int			route = c->route;
	int			p = call_partition(c, fcinfo);
	bool		isnull = false;
	Datum		result;

	result = call_on_shard_guarded(c, fcinfo, p, &isnull);
	/* (c may have been invalidated meanwhile: only route is read from here) */
	if (routes[route].place)
		place_transaction(isnull ? NULL : DatumGetTextPP(result), p,
						  PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2),
						  PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3));
	if (isnull)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

/* ----------------------------------------------------------------
 * The routing functions, for every router function
 * ---------------------------------------------------------------- */

/*
 * payidem._place_transaction(outcome, payment_no, status, transaction_id)
 *		RETURNS text: the outcome, after placing the transaction id
 *		(place_transaction()), for apply_payment_result_ex().
 */
PG_FUNCTION_INFO_V1(payidem_router_place_transaction);
Datum
payidem_router_place_transaction(PG_FUNCTION_ARGS)
{
	text	   *payment_no = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);

	/* (the payment's partition: partition_of(), as its call was routed) */
	place_transaction(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0),
					  payment_no ? partition_of(VARDATA_ANY(payment_no), VARSIZE_ANY_EXHDR(payment_no), "payment") : 0,
					  PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2),
					  PG_ARGISNULL(3) ? NULL : PG_GETARG_TEXT_PP(3));
	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	PG_RETURN_DATUM(PG_GETARG_DATUM(0));
}

PG_FUNCTION_INFO_V1(payidem_router_cluster_partitions);
Datum
payidem_router_cluster_partitions(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(cluster_load(false));
}

PG_FUNCTION_INFO_V1(payidem_router_check_partition);
Datum
payidem_router_check_partition(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(check_partition(PG_ARGISNULL(0) ? 0 : PG_GETARG_INT32(0), PG_ARGISNULL(0)));
}

PG_FUNCTION_INFO_V1(payidem_router_partition_of);
Datum
payidem_router_partition_of(PG_FUNCTION_ARGS)
{
	char	   *kind = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));

	if (PG_ARGISNULL(0))
		PG_RETURN_INT32(partition_of(NULL, 0, kind));
	else
	{
		text	   *number = PG_GETARG_TEXT_PP(0);

		PG_RETURN_INT32(partition_of(VARDATA_ANY(number), VARSIZE_ANY_EXHDR(number), kind));
	}
}

/*
 * payidem._shard_failure(lost boolean, partition integer, database text, reason text)
 *		RETURNS (state, message, detail, hint): 08006 in router_shard_failure's
 *		words, for the PL/Proxy functions' error wrapper.
 */
PG_FUNCTION_INFO_V1(payidem_router_shard_failure);
Datum
payidem_router_shard_failure(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	ShardFailure f;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	f = shard_failure(PG_ARGISNULL(0) ? false : PG_GETARG_BOOL(0),
					  PG_ARGISNULL(1) ? -1 : PG_GETARG_INT32(1),
					  PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2)),
					  PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3)));
	values[0] = CStringGetTextDatum("08006");
	values[1] = CStringGetTextDatum(f.message);
	if (f.detail)
		values[2] = CStringGetTextDatum(f.detail);
	else
		nulls[2] = true;
	values[3] = CStringGetTextDatum(f.hint);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
