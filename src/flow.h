/*-------------------------------------------------------------------------
 *
 * flow.h
 *		apply_payment_result() (flow.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PAYIDEM_FLOW_H
#define PAYIDEM_FLOW_H

#include "datatype/timestamp.h"

extern void flow_define_gucs(void);
extern bool payidem_paid_at_acceptable(TimestampTz created_at, TimestampTz paid_at);

#endif							/* PAYIDEM_FLOW_H */
