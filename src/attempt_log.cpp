/*
 * attempt_log.cpp — writing outbox.attempts and emptying its old days.
 * See attempt_log.h and core/attempt_log.hpp.
 */
#include "attempt_log.h"
#include "guard.h"
#include "transitions.h"
#include "core/attempt_log.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
}

static SPIPlanPtr plan_log = nullptr;

/* the columns unnested in the select list, not in FROM: see SQL_FINALIZE_TEXT in transitions.cpp (23 % fewer
 * instructions per row than 13 tuplestores, one per array) */
static const char *const SQL_LOG_ATTEMPTS =
    "INSERT INTO outbox.attempts"
    "   (message_id, lease_version, attempt, endpoint, worker, started_at, duration_ms, outcome,"
    "    http_status, error_class, retry_after, response_body, bucket)"
    " SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::int[]), unnest($4::text[]), unnest($5::int[]),"
    "        unnest($6::timestamptz[]), unnest($7::float8[]), unnest($8::text[]), unnest($9::int[]),"
    "        unnest($10::text[]), unnest($11::text[]), unnest($12::text[]), unnest($13::int2[])";

void
od_log_attempts(const OdAttempt *rows, int n)
{
    static const Oid types[13] = { INT8ARRAYOID,   INT8ARRAYOID, INT4ARRAYOID,   TEXTARRAYOID, INT4ARRAYOID,
                                   TIMESTAMPTZARRAYOID, FLOAT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TEXTARRAYOID,
                                   TEXTARRAYOID,   TEXTARRAYOID, INT2ARRAYOID };
    static const Oid elem[13] = { INT8OID, INT8OID, INT4OID, TEXTOID, INT4OID, TIMESTAMPTZOID, FLOAT8OID,
                                  TEXTOID, INT4OID, TEXTOID, TEXTOID, TEXTOID, INT2OID };
    Datum           *cols[13];
    bool            *nulls[13];
    Datum            args[13];
    int              rc;

    if (n <= 0)
        return;
    for (int c = 0; c < 13; c++)
    {
        cols[c] = (Datum *) palloc(sizeof(Datum) * n);
        nulls[c] = (bool *) palloc0(sizeof(bool) * n);
    }
    for (int i = 0; i < n; i++)
    {
        const OdAttempt *r = &rows[i];
        int64            unix_us = od_unix_micros(r->started_at);

        cols[0][i] = Int64GetDatum(r->message_id);
        cols[1][i] = Int64GetDatum(r->lease_version);
        cols[2][i] = Int32GetDatum(r->attempt);
        cols[3][i] = CStringGetTextDatum(r->endpoint ? r->endpoint : "");
        cols[4][i] = Int32GetDatum(r->worker);
        cols[5][i] = TimestampTzGetDatum(r->started_at);
        cols[6][i] = Float8GetDatum(r->duration_ms);
        cols[7][i] = CStringGetTextDatum(r->outcome);
        cols[8][i] = Int32GetDatum(r->http_status);
        nulls[8][i] = (r->http_status == 0);
        nulls[9][i] = (r->error_class == nullptr);
        cols[9][i] = r->error_class ? CStringGetTextDatum(r->error_class) : (Datum) 0;
        nulls[10][i] = (r->retry_after == nullptr);
        cols[10][i] = r->retry_after ? CStringGetTextDatum(r->retry_after) : (Datum) 0;
        nulls[11][i] = (r->body == nullptr);
        cols[11][i] = r->body ? CStringGetTextDatum(r->body) : (Datum) 0;
        cols[12][i] = Int16GetDatum((int16) od::attempt_bucket(od::attempt_day(unix_us)));
    }
    for (int c = 0; c < 13; c++)
        args[c] = PointerGetDatum(od_build_array(cols[c], nulls[c], n, elem[c]));
    od_prepare(&plan_log, SQL_LOG_ATTEMPTS, 13, types);
    rc = SPI_execute_plan(plan_log, args, nullptr, false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "outbox_dispatcher: writing outbox.attempts failed: %s", SPI_result_code_string(rc));
}

/*
 * A statement on one partition, by its started_at when it names a cutoff.
 * The workers' sessions disable bitmap scans (transitions.cpp); this one
 * may use them, so that the started_at conditions read the partition's BRIN
 * summary (and its not yet summarized tail) instead of every row: "are
 * there rows before the cutoff" in today's partition otherwise read the
 * whole day (121 ms for 300,000 rows, after every reload).
 */
static const OdPlanShape by_started_at[] = { { "enable_bitmapscan", "on" } };

static int
run_on_partition(const char *sql, Datum cutoff, bool read_only, long limit)
{
    static const Oid types[1] = { TIMESTAMPTZOID };
    Datum            args[1] = { cutoff };
    int              nest = od_plan_shapes_push(by_started_at, lengthof(by_started_at));
    int              rc;

    rc = SPI_execute_with_args(sql, strchr(sql, '$') ? 1 : 0, const_cast<Oid *>(types), args, nullptr, read_only,
                               limit);
    od_plan_shapes_pop(nest);
    return rc;
}

static bool
query_bool(const char *sql, Datum cutoff)
{
    bool isnull;
    int  rc = run_on_partition(sql, cutoff, true, 1);

    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "outbox_dispatcher: reading outbox.attempts failed: %s", SPI_result_code_string(rc));
    return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) && !isnull;
}

/*
 * The day each kept partition was last checked for rows older than the
 * cutoff: once per day each (and again after a reload), so that a
 * partition that was not emptied before it came back into use (the server
 * was down that day, or a reader held it every minute) loses its old rows
 * all the same — by DELETE, since it also holds rows to keep.
 */
static int64 kept_checked_day[od::kAttemptBuckets];
static bool  kept_checked_valid = false;

static void
delete_older(const char *relname, TimestampTz cutoff)
{
    char *sql = psprintf("DELETE FROM outbox.%s WHERE started_at < $1", relname);

    if (run_on_partition(sql, TimestampTzGetDatum(cutoff), false, 0) != SPI_OK_DELETE)
        elog(ERROR, "outbox_dispatcher: expiring outbox.%s failed", relname);
}

int
od_expire_attempts(int retention_days, bool recheck)
{
    Oid         nsp = get_namespace_oid("outbox", true);
    int64       today = od::attempt_day(od_unix_micros(GetCurrentTimestamp()));
    int         emptied = 0;
    TimestampTz cutoff;

    if (!OidIsValid(nsp))
        return 0;
    if (retention_days > od::kMaxAttemptRetentionDays)
        retention_days = od::kMaxAttemptRetentionDays;
    if (recheck || !kept_checked_valid)
    {
        for (int b = 0; b < od::kAttemptBuckets; b++)
            kept_checked_day[b] = PG_INT64_MIN;
        kept_checked_valid = true;
    }
    /* the first microsecond of the oldest day kept */
    cutoff = od_from_unix_micros((today - retention_days) * INT64_C(86400000000));
    for (int b = 0; b < od::kAttemptBuckets; b++)
    {
        char relname[NAMEDATALEN];
        Oid  relid;

        snprintf(relname, sizeof relname, "attempts_%02d", b);
        relid = get_relname_relid(relname, nsp);
        if (!OidIsValid(relid))
            continue;
        if (od::attempt_bucket_kept(b, today, retention_days))
        {
            if (kept_checked_day[b] != today)
            {
                /* rows of an earlier turn of the ring, if it was never emptied (rare) */
                if (query_bool(psprintf("SELECT EXISTS (SELECT FROM outbox.%s WHERE started_at < $1)", relname),
                               TimestampTzGetDatum(cutoff)))
                    delete_older(relname, cutoff);
                kept_checked_day[b] = today;
            }
            continue;
        }
        if (!query_bool(psprintf("SELECT EXISTS (SELECT FROM outbox.%s)", relname), (Datum) 0))
            continue;
        if (query_bool(psprintf("SELECT EXISTS (SELECT FROM outbox.%s WHERE started_at >= $1)", relname),
                       TimestampTzGetDatum(cutoff)))
        {
            /* newer rows too (a clock that went back): keep them, drop the old ones (rare) */
            delete_older(relname, cutoff);
            continue;
        }
        /* a reader of the partition (or of outbox.attempts) holds it: next time */
        if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
            continue;
        if (SPI_execute(psprintf("TRUNCATE outbox.%s", relname), false, 0) != SPI_OK_UTILITY)
            elog(ERROR, "outbox_dispatcher: emptying outbox.%s failed", relname);
        emptied++;
    }
    return emptied;
}
