/*
 * guard.cpp — a fixed search_path around every statement the extension runs,
 * and the time conversions (saturating interval arithmetic, Unix times).
 *
 * Why: SQL text is resolved against the session's search_path.  Where a call
 * needs an implicit coercion (numeric * integer, format(text, integer, ...)),
 * a better-matching function or operator in any schema on the path wins over
 * pg_catalog's — and since PostgreSQL 15 the public schema belongs to the
 * database owner, typically the application role that produces messages.
 * Pinning search_path to "pg_catalog, pg_temp" leaves nothing but the
 * catalog for unqualified names (pg_temp is searched for relations only,
 * never for functions or operators, unless named explicitly).
 *
 * The pin is a GUC nest level, exactly what a function's SET clause does:
 * od_unpin_search_path() restores the caller's value, and an ERROR in
 * between restores it as part of (sub)transaction abort.
 */
#include "outbox_dispatcher.h"
#include "guard.h"

extern "C" {
#include "catalog/namespace.h"
#include "utils/guc.h"
}

int
od_pin_search_path(void)
{
    int level;

    /*
     * Already pinned (the function's own SET clause, or a worker session):
     * nothing to do.  Setting it again would cost a GUC nest level and a
     * recomputation of the namespace search path on every call.
     */
    if (namespace_search_path != nullptr && strcmp(namespace_search_path, OD_SAFE_SEARCH_PATH) == 0)
        return -1;
    level = NewGUCNestLevel();
    (void) set_config_option("search_path", OD_SAFE_SEARCH_PATH, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                             false);
    return level;
}

void
od_unpin_search_path(int nestlevel)
{
    if (nestlevel >= 0)
        AtEOXact_GUC(true, nestlevel);
}

int
od_spi_connect(void)
{
    int level = od_pin_search_path();

    SPI_connect();
    return level;
}

void
od_spi_finish(int nestlevel)
{
    SPI_finish();
    od_unpin_search_path(nestlevel);
}

/*
 * Interval -> microseconds, months counted as 30 days (like interval_cmp).
 * Saturates instead of overflowing: interval '178000000 years' or the
 * infinite intervals of PostgreSQL 17 become INT64_MAX / INT64_MIN, which
 * every caller's range check then rejects.
 */
int64
od_interval_us(const Interval *iv)
{
    __int128 us = (__int128) iv->time + (__int128) iv->day * USECS_PER_DAY +
        (__int128) iv->month * DAYS_PER_MONTH * USECS_PER_DAY;

    if (us > (__int128) PG_INT64_MAX)
        return PG_INT64_MAX;
    if (us < (__int128) PG_INT64_MIN)
        return PG_INT64_MIN;
    return (int64) us;
}

int64
od_unix_seconds(TimestampTz ts)
{
    return (int64) (ts / USECS_PER_SEC) + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

int64
od_unix_micros(TimestampTz ts)
{
    return ts + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

TimestampTz
od_from_unix_micros(int64 unix_us)
{
    return unix_us - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
}

Datum
od_us_to_interval(int64 us)
{
    Interval *iv = (Interval *) palloc0(sizeof(Interval));

    iv->time = us;
    return IntervalPGetDatum(iv);
}

void
od_require_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
    if (PG_ARGISNULL(argno))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("%s must not be null", name)));
}
