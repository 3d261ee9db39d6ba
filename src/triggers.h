/*
 * triggers.h — the row checks of triggers.cpp that other code applies too.
 */
#ifndef OUTBOX_DISPATCHER_TRIGGERS_H
#define OUTBOX_DISPATCHER_TRIGGERS_H

#include "outbox_dispatcher.h"

/*
 * The checks messages_check applies to a new row's producer columns
 * (header-safe texts, headers object, payload size, available_at), on
 * values: for outbox.publish(), whose input must be refused even when no
 * subscription matches and no row is written.  Raises an ERROR.
 */
extern void od_check_message_values(Datum aggregate_type, Datum aggregate_id, Datum event_type, Datum payload,
                                    Datum headers, bool headers_null, Datum available_at, bool available_at_null);

/*
 * A text value that is sent as (part of) an HTTP header value: at most 8 KB,
 * no control characters, not empty unless allow_empty; the error names
 * colname.  Raises an ERROR.
 */
extern void od_check_header_safe_value(Datum d, const char *colname, bool allow_empty);

/* A Standard Webhooks signing secret (whsec_<base64>); the error names colname, never the value. */
extern void od_check_secret_value(Datum d, const char *colname);

#endif
