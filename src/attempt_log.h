/*
 * attempt_log.h — outbox.attempts (0.3.0): one row per HTTP attempt the
 * workers made, written in their finalize transaction, and its retention
 * (attempt_log.cpp; the ring of partitions is core/attempt_log.hpp).
 */
#ifndef OUTBOX_DISPATCHER_ATTEMPT_LOG_H
#define OUTBOX_DISPATCHER_ATTEMPT_LOG_H

#include "outbox_dispatcher.h"

typedef struct OdAttempt
{
    int64       message_id;
    int64       lease_version;
    int         attempt;
    const char *endpoint;
    int         worker;
    TimestampTz started_at;
    double      duration_ms;
    const char *outcome;     /* done, retry, defer, dead; lost = the finalize found the lease taken over */
    int         http_status; /* 0 = none */
    const char *error_class; /* NULL when an HTTP response came (core/outcome.hpp transport_error_class) */
    const char *retry_after; /* NULL = none */
    const char *body;        /* sanitized response body prefix; NULL = empty */
} OdAttempt;

/*
 * Insert the rows, inside the finalize's transaction: straight into the
 * day's partition when nothing (a trigger, a rule, row-level security, a
 * CHECK constraint, a changed table) needs the INSERT; else one INSERT
 * through SPI.
 */
extern void od_log_attempts(const OdAttempt *rows, int n);

/*
 * Empty every partition of outbox.attempts that holds only days older than
 * retention_days (TRUNCATE, skipped while someone reads it; a partition
 * with newer rows, after a clock change, loses only its old rows, by
 * DELETE).  Each kept partition is also checked once a day (every one
 * again when recheck: the retention may have changed) for rows of an
 * earlier turn of the ring that were never emptied, which are deleted.
 * Returns the number of partitions emptied.  Needs SPI.
 */
extern int  od_expire_attempts(int retention_days, bool recheck);

#endif
