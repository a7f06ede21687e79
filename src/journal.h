/*-------------------------------------------------------------------------
 *
 * journal.h
 *		The journal's rules, checked at commit for every writer (journal.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_JOURNAL_H
#define PAYIDEM_JOURNAL_H

extern void journal_init(void);

#endif							/* PAYIDEM_JOURNAL_H */
