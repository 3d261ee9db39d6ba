/*
 * guard.h — declarations of guard.cpp: a fixed search_path around every statement the extension runs, and saturating time arithmetic.
 */
#ifndef OUTBOX_DISPATCHER_GUARD_H
#define OUTBOX_DISPATCHER_GUARD_H

#include "outbox_dispatcher.h"

/*
 * Every statement the extension runs is parsed with this search_path, so
 * that no object a producer created (for instance in a public schema it
 * owns) can ever be picked by name resolution.  The workers set it for their
 * whole session; SQL-callable functions pin it around their SPI work.
 */
#define OD_SAFE_SEARCH_PATH "pg_catalog, pg_temp"

/* Pin search_path for the current function; returns the GUC nest level to pass to unpin. */
extern int   od_pin_search_path(void);
extern void  od_unpin_search_path(int nestlevel);
/* SPI_connect + pin, and unpin + SPI_finish. */
extern int   od_spi_connect(void);
extern void  od_spi_finish(int nestlevel);

/* Argument argno of a SQL-callable function is not null; "<name> must not be null" otherwise. */
extern void  od_require_arg(FunctionCallInfo fcinfo, int argno, const char *name);

/*
 * Time conversions, the only ones: saturating interval -> microseconds
 * (months as 30 days; infinite intervals saturate), microseconds -> an
 * interval Datum (palloc'd), and a TimestampTz as Unix seconds or
 * microseconds (what core/ and the wire use), and back.
 */
extern int64 od_interval_us(const Interval *iv);
extern Datum od_us_to_interval(int64 us);
extern int64 od_unix_seconds(TimestampTz ts);
extern int64 od_unix_micros(TimestampTz ts);
extern TimestampTz od_from_unix_micros(int64 unix_us);

#endif /* OUTBOX_DISPATCHER_GUARD_H */
