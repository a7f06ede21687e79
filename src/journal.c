/*-------------------------------------------------------------------------
 *
 * journal.c
 *		The double-entry journal's two rules (DESIGN section 11), checked at
 *		commit for every writer — settle(), the payout and adjustment
 *		functions, a DBA's own INSERT or UPDATE:
 *
 *		  every journal balances: for each journal_no and currency, the
 *		  entries a transaction adds sum to 0;
 *
 *		  a balance equals its entries: what a transaction changes in
 *		  merchant_balance.available (in_payout) equals the negated sum of
 *		  the merchant_available (merchant_payout) entries it adds for that
 *		  merchant and currency.
 *
 *		A transaction that breaks one is refused at commit with PI002 (the
 *		message names the rule, DETAIL the journal or balance and the sums).
 *		Both hold by induction: every committed transaction kept them, so the
 *		tables never need to be read to check them — only what this
 *		transaction wrote.
 *
 *   payidem._journal_capture() — AFTER INSERT ... REFERENCING NEW TABLE ...
 *     FOR EACH STATEMENT on ledger_entry: the statement's entries, summed
 *     per journal (a journal written in one statement, as every payidem
 *     function writes it, sums to 0 there and leaves nothing to keep) and per
 *     merchant account.
 *
 *   payidem._balance_capture() — AFTER INSERT / AFTER UPDATE ... FOR EACH
 *     STATEMENT with transition tables on merchant_balance: the changes of
 *     available and in_payout per merchant and currency.
 *
 * What is left over is kept, tagged with the subtransaction that wrote it
 * (an aborted subtransaction's part is dropped, a committed one's passes to
 * its parent), and summed up at XACT_EVENT_PRE_COMMIT (and PRE_PREPARE),
 * after the deferred triggers, when an error still aborts the transaction.
 *
 * A restore's COPY of either table (payidem_restoring: its owner or a
 * superuser copying into that very table) is taken as it was dumped;
 * verify() re-derives both rules from the tables.  Ordinary triggers, like
 * the others of payidem: session_replication_role = replica skips them, and
 * verify() finds what was written that way.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/trigger.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "catalog.h"
#include "errcodes.h"
#include "journal.h"
#include "replication.h"
#include "util.h"

#ifndef HAVE_INT128
#error "payidem's journal sums need a 128-bit integer type"
#endif

/* what a kept sum is of */
typedef enum JournalKind
{
	JOURNAL_SUM,				/* a journal's entries (must be 0) */
	BALANCE_AVAILABLE,			/* merchant_available: entries vs. the row */
	BALANCE_IN_PAYOUT			/* merchant_payout: entries vs. the row */
} JournalKind;

/* a sum left over by one statement, in TopTransactionContext */
typedef struct JournalDelta
{
	int			level;			/* the (sub)transaction nest level that wrote it */
	JournalKind kind;
	char	   *key;			/* journal_no or merchant_no */
	char		currency[4];
	int128		entries;		/* sum of entries (balances: negated) */
	int128		balance;		/* change of the balance row */
} JournalDelta;

static List *journal_deltas = NIL;
static bool journal_callbacks_registered = false;

/* the key the deltas are summed under at commit */
/*
 * kind|currency|key: a journal_no or merchant_no is at most 64 characters
 * (ledger_entry's checks), 256 bytes in any encoding; a longer key (a table
 * whose checks were dropped) is refused rather than cut short, so that two
 * keys never share a sum.
 */
#define JOURNAL_KEY_LEN 1024
typedef struct JournalTotal
{
	char		hkey[JOURNAL_KEY_LEN];
	JournalKind kind;
	char	   *key;
	char		currency[4];
	int128		entries;
	int128		balance;
} JournalTotal;

static void
journal_key_too_long(const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("a journal_no or merchant_no of payidem.ledger_entry is too long"),
			 errdetail("The value has %zu bytes; a journal_no or merchant_no has at most 64 characters.", strlen(key))));
}

static void
keep_delta(JournalKind kind, const char *key, const char *currency, int128 entries, int128 balance)
{
	MemoryContext old;
	JournalDelta *d;

	if (entries == 0 && balance == 0)
		return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	d = palloc(sizeof(JournalDelta));
	d->level = GetCurrentTransactionNestLevel();
	d->kind = kind;
	d->key = pstrdup(key);
	strlcpy(d->currency, currency, sizeof(d->currency));
	d->entries = entries;
	d->balance = balance;
	journal_deltas = lappend(journal_deltas, d);
	MemoryContextSwitchTo(old);
}

/* an int128 as decimal text */
static char *
int128_text(int128 v)
{
	char		buf[48];
	char	   *p = buf + sizeof(buf) - 1;
	bool		neg = v < 0;
	uint128		u = neg ? -(uint128) v : (uint128) v;

	*p = '\0';
	do
	{
		*--p = '0' + (int) (u % 10);
		u /= 10;
	} while (u != 0);
	if (neg)
		*--p = '-';
	return pstrdup(p);
}

static void
check_trigger(FunctionCallInfo fcinfo, const char *name)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) || trigdata->tg_newtable == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s must be an AFTER ... FOR EACH STATEMENT trigger with REFERENCING NEW TABLE", name)));
}

/* a slot to read a transition table of rel with, and a read pointer of its own */
static TupleTableSlot *
begin_read(Relation rel, Tuplestorestate *ts)
{
	int			ptr = tuplestore_alloc_read_pointer(ts, 0);

	tuplestore_select_read_pointer(ts, ptr);
	tuplestore_rescan(ts);
	return MakeSingleTupleTableSlot(RelationGetDescr(rel), &TTSOpsMinimalTuple);
}

static char *
slot_text(TupleTableSlot *slot, int attnum, bool *isnull)
{
	Datum		d = slot_getattr(slot, attnum, isnull);

	return *isnull ? NULL : TextDatumGetCString(d);
}

/* per merchant, currency and account within one statement */
typedef struct StatementBalance
{
	char		hkey[JOURNAL_KEY_LEN];
	JournalKind kind;
	char	   *merchant_no;
	char		currency[4];
	int128		entries;
	int128		balance;
} StatementBalance;

static HTAB *
statement_balances(void)
{
	HASHCTL		ctl;

	ctl.keysize = JOURNAL_KEY_LEN;
	ctl.entrysize = sizeof(StatementBalance);
	ctl.hcxt = CurrentMemoryContext;
	return hash_create("payidem statement balances", 64, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

static void
add_balance(HTAB *h, JournalKind kind, const char *merchant_no, const char *currency,
			int128 entries, int128 balance)
{
	char		hkey[JOURNAL_KEY_LEN];
	StatementBalance *b;
	bool		found;

	if (snprintf(hkey, sizeof(hkey), "%d|%s|%s", (int) kind, currency, merchant_no) >= (int) sizeof(hkey))
		journal_key_too_long(merchant_no);
	b = hash_search(h, hkey, HASH_ENTER, &found);
	if (!found)
	{
		b->kind = kind;
		b->merchant_no = pstrdup(merchant_no);
		strlcpy(b->currency, currency, sizeof(b->currency));
		b->entries = 0;
		b->balance = 0;
	}
	b->entries += entries;
	b->balance += balance;
}

static void
keep_balances(HTAB *h)
{
	HASH_SEQ_STATUS seq;
	StatementBalance *b;

	hash_seq_init(&seq, h);
	while ((b = hash_seq_search(&seq)) != NULL)
		if (b->entries != b->balance)
			keep_delta(b->kind, b->merchant_no, b->currency, b->entries, b->balance);
}

/*
 * payidem._journal_capture() — the entries a statement added to
 * ledger_entry.
 */
PG_FUNCTION_INFO_V1(payidem_journal_capture);
Datum
payidem_journal_capture(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleTableSlot *slot;
	HTAB	   *balances;
	int			a_journal,
				a_account,
				a_merchant,
				a_currency,
				a_amount;
	char	   *cur_journal = NULL;
	char		cur_currency[4] = "";
	int128		cur_sum = 0;
	bool		copying;

	check_trigger(fcinfo, "payidem._journal_capture()");
	payidem_require_replication("a journal entry");
	rel = trigdata->tg_relation;
	if (payidem_restoring(rel, &copying))
		return PointerGetDatum(NULL);
	a_journal = payidem_column(rel, "journal_no");
	a_account = payidem_column(rel, "account");
	a_merchant = payidem_column(rel, "merchant_no");
	a_currency = payidem_column(rel, "currency");
	a_amount = payidem_column(rel, "amount");

	balances = statement_balances();
	slot = begin_read(rel, trigdata->tg_newtable);
	while (tuplestore_gettupleslot(trigdata->tg_newtable, true, false, slot))
	{
		bool		n1,
					n2,
					n3,
					n4;
		text	   *journal = DatumGetTextPP(slot_getattr(slot, a_journal, &n1));
		text	   *currency = DatumGetTextPP(slot_getattr(slot, a_currency, &n2));
		text	   *account = DatumGetTextPP(slot_getattr(slot, a_account, &n3));
		int64		amount = DatumGetInt64(slot_getattr(slot, a_amount, &n4));
		int			jlen,
					alen;
		const char *acc;

		/* the columns are NOT NULL */
		if (n1 || n2 || n3 || n4)
			continue;
		jlen = VARSIZE_ANY_EXHDR(journal);
		if (cur_journal == NULL || (int) strlen(cur_journal) != jlen ||
			memcmp(cur_journal, VARDATA_ANY(journal), jlen) != 0 ||
			VARSIZE_ANY_EXHDR(currency) < 3 || memcmp(cur_currency, VARDATA_ANY(currency), 3) != 0)
		{
			if (cur_journal != NULL)
			{
				if (cur_sum != 0)
					keep_delta(JOURNAL_SUM, cur_journal, cur_currency, cur_sum, 0);
				pfree(cur_journal);
			}
			cur_journal = pnstrdup(VARDATA_ANY(journal), jlen);
			memset(cur_currency, 0, sizeof(cur_currency));
			memcpy(cur_currency, VARDATA_ANY(currency), Min(3, VARSIZE_ANY_EXHDR(currency)));
			cur_sum = 0;
		}
		cur_sum += amount;

		/* merchant_available, merchant_payout */
		acc = VARDATA_ANY(account);
		alen = VARSIZE_ANY_EXHDR(account);
		if (alen > 9 && memcmp(acc, "merchant_", 9) == 0 &&
			((alen == 18 && memcmp(acc, "merchant_available", 18) == 0) ||
			 (alen == 15 && memcmp(acc, "merchant_payout", 15) == 0)))
		{
			bool		isnull;
			char	   *merchant_no = slot_text(slot, a_merchant, &isnull);

			if (merchant_no != NULL)
			{
				add_balance(balances, alen == 18 ? BALANCE_AVAILABLE : BALANCE_IN_PAYOUT,
							merchant_no, cur_currency, -(int128) amount, 0);
				pfree(merchant_no);
			}
		}
	}
	if (cur_journal != NULL && cur_sum != 0)
		keep_delta(JOURNAL_SUM, cur_journal, cur_currency, cur_sum, 0);
	keep_balances(balances);
	hash_destroy(balances);
	ExecDropSingleTupleTableSlot(slot);
	return PointerGetDatum(NULL);
}

/* one side (old or new rows) of merchant_balance, into h with sign */
static void
add_balance_rows(HTAB *h, Relation rel, Tuplestorestate *ts, int sign)
{
	TupleTableSlot *slot = begin_read(rel, ts);
	int			a_merchant = payidem_column(rel, "merchant_no");
	int			a_currency = payidem_column(rel, "currency");
	int			a_available = payidem_column(rel, "available");
	int			a_in_payout = payidem_column(rel, "in_payout");

	while (tuplestore_gettupleslot(ts, true, false, slot))
	{
		bool		null1,
					null2,
					null3,
					null4;
		char	   *merchant_no = slot_text(slot, a_merchant, &null1);
		char	   *currency = slot_text(slot, a_currency, &null2);
		int64		available = DatumGetInt64(slot_getattr(slot, a_available, &null3));
		int64		in_payout = DatumGetInt64(slot_getattr(slot, a_in_payout, &null4));

		if (null1 || null2)
			continue;
		add_balance(h, BALANCE_AVAILABLE, merchant_no, currency, 0,
					null3 ? 0 : sign * (int128) available);
		add_balance(h, BALANCE_IN_PAYOUT, merchant_no, currency, 0,
					null4 ? 0 : sign * (int128) in_payout);
	}
	ExecDropSingleTupleTableSlot(slot);
}

/*
 * payidem._balance_capture() — what a statement changed in
 * merchant_balance: new rows minus old rows, per merchant and currency.
 */
PG_FUNCTION_INFO_V1(payidem_balance_capture);
Datum
payidem_balance_capture(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	HTAB	   *balances;
	bool		copying;

	check_trigger(fcinfo, "payidem._balance_capture()");
	rel = trigdata->tg_relation;
	if (payidem_restoring(rel, &copying))
		return PointerGetDatum(NULL);
	balances = statement_balances();
	add_balance_rows(balances, rel, trigdata->tg_newtable, 1);
	if (trigdata->tg_oldtable != NULL)
		add_balance_rows(balances, rel, trigdata->tg_oldtable, -1);
	keep_balances(balances);
	hash_destroy(balances);
	return PointerGetDatum(NULL);
}

/* the sums of this transaction; PI002 for the first that breaks a rule */
static void
journal_check(void)
{
	HASHCTL		ctl;
	HTAB	   *totals;
	ListCell   *lc;
	HASH_SEQ_STATUS seq;
	JournalTotal *t;
	JournalTotal *bad = NULL;

	ctl.keysize = JOURNAL_KEY_LEN;
	ctl.entrysize = sizeof(JournalTotal);
	ctl.hcxt = CurrentMemoryContext;
	totals = hash_create("payidem journal totals", 64, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	foreach(lc, journal_deltas)
	{
		JournalDelta *d = lfirst(lc);
		char		hkey[JOURNAL_KEY_LEN];
		bool		found;

		if (snprintf(hkey, sizeof(hkey), "%d|%s|%s", (int) d->kind, d->currency, d->key) >= (int) sizeof(hkey))
			journal_key_too_long(d->key);
		t = hash_search(totals, hkey, HASH_ENTER, &found);
		if (!found)
		{
			t->kind = d->kind;
			t->key = d->key;
			memcpy(t->currency, d->currency, sizeof(t->currency));
			t->entries = 0;
			t->balance = 0;
		}
		t->entries += d->entries;
		t->balance += d->balance;
	}
	/* the first broken rule in a fixed order: journals first, then by key */
	hash_seq_init(&seq, totals);
	while ((t = hash_seq_search(&seq)) != NULL)
	{
		if (t->entries == t->balance)
			continue;
		if (bad == NULL || t->kind < bad->kind ||
			(t->kind == bad->kind && strcmp(t->hkey, bad->hkey) < 0))
			bad = t;
	}
	if (bad == NULL)
		return;
	if (bad->kind == JOURNAL_SUM)
		ereport(ERROR,
				(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
				 errmsg("journal %s does not balance", payidem_quote_value(bad->key, strlen(bad->key))),
				 errdetail("Its entries in %s written by this transaction sum to %s; a journal's entries sum to 0 in each currency.",
						   bad->currency, int128_text(bad->entries)),
				 errhint("Write all entries of a journal in one transaction: settle(), request_payout(), apply_payout_result() and adjust_balance() do.")));
	ereport(ERROR,
			(errcode(ERRCODE_PAYIDEM_ILLEGAL_TRANSITION),
			 errmsg("the %s balance of merchant %s does not match its journal",
					bad->kind == BALANCE_AVAILABLE ? "available" : "in-payout",
					payidem_quote_value(bad->key, strlen(bad->key))),
			 errdetail("This transaction changed merchant_balance.%s (%s) by %s and wrote %s entries that change it by %s.",
					   bad->kind == BALANCE_AVAILABLE ? "available" : "in_payout", bad->currency,
					   int128_text(bad->balance),
					   bad->kind == BALANCE_AVAILABLE ? "merchant_available" : "merchant_payout",
					   int128_text(bad->entries)),
			 errhint("A balance moves only with its journal entries: use settle(), request_payout(), apply_payout_result() or adjust_balance().")));
}

static void
journal_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (journal_deltas != NIL)
				journal_check();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			journal_deltas = NIL;	/* its memory went with the transaction */
			break;
		default:
			break;
	}
}

static void
journal_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	int			level;
	ListCell   *lc;

	if (journal_deltas == NIL)
		return;
	level = GetCurrentTransactionNestLevel();
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		foreach(lc, journal_deltas)
		{
			JournalDelta *d = lfirst(lc);

			if (d->level >= level)
				journal_deltas = foreach_delete_current(journal_deltas, lc);
		}
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(lc, journal_deltas)
		{
			JournalDelta *d = lfirst(lc);

			if (d->level >= level)
				d->level = level - 1;
		}
	}
}

/* from _PG_init, preloaded or not */
void
journal_init(void)
{
	if (journal_callbacks_registered)
		return;
	RegisterXactCallback(journal_xact_callback, NULL);
	RegisterSubXactCallback(journal_subxact_callback, NULL);
	journal_callbacks_registered = true;
}
