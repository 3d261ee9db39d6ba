/*
 * stats.cpp — outbox.worker_stats: one row per worker slot, read from
 * shared memory without locks (counters are atomics; last_error is copied
 * under the slot's spinlock).
 *
 * Latency percentiles come from the power-of-two histogram of
 * core/histogram.hpp, so p50/p99 are upper bounds with at most 2x
 * resolution; avg and max are exact.
 */
#include "outbox_dispatcher.h"
#include "module.h"

extern "C" {
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(od_worker_stats_sql);
PG_FUNCTION_INFO_V1(od_replication_wait_sql);
}

static const char *const state_names[] = { "stopped",    "starting",   "idle",   "claiming",
                                           "delivering", "finalizing", "paused", "waiting for replication" };
static_assert(sizeof(state_names) / sizeof(state_names[0]) == OD_STATE_WAITING_REPLICATION + 1,
              "a name for every worker state");

extern "C" Datum
od_worker_stats_sql(PG_FUNCTION_ARGS)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

    InitMaterializedSRF(fcinfo, 0);
    if (od_shared == nullptr)
        return (Datum) 0;

    for (int i = 0; i < od_workers && i < OD_MAX_WORKERS; i++)
    {
        OdWorkerSlot *w = &od_shared->workers[i];
        Datum         values[19];
        bool          nulls[19];
        uint64        buckets[OD_LATENCY_BUCKETS];
        uint64        count;
        uint32        state;
        char          last_error[sizeof(w->last_error)];
        TimestampTz   last_error_at;
        pid_t         pid = w->pid;

        memset(nulls, 0, sizeof(nulls));
        state = pg_atomic_read_u32(&w->state);
        if (state > OD_STATE_WAITING_REPLICATION)
            state = OD_STATE_STOPPED;
        count = pg_atomic_read_u64(&w->latency_count);
        for (int b = 0; b < OD_LATENCY_BUCKETS; b++)
            buckets[b] = pg_atomic_read_u64(&w->latency_buckets[b]);
        SpinLockAcquire(&w->mutex);
        memcpy(last_error, w->last_error, sizeof(last_error));
        last_error_at = w->last_error_at;
        SpinLockRelease(&w->mutex);

        values[0] = Int32GetDatum(i);
        values[1] = Int32GetDatum(pid);
        nulls[1] = (pid == 0);
        values[2] = CStringGetTextDatum(pid == 0 ? "stopped" : state_names[state]);
        values[3] = TimestampTzGetDatum(w->started_at);
        nulls[3] = (w->started_at == 0);
        values[4] = Int64GetDatum((int64) pg_atomic_read_u64(&w->claimed));
        values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&w->delivered));
        values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&w->retried));
        values[7] = Int64GetDatum((int64) pg_atomic_read_u64(&w->deferred));
        values[8] = Int64GetDatum((int64) pg_atomic_read_u64(&w->dead));
        values[9] = Int64GetDatum((int64) pg_atomic_read_u64(&w->reaped));
        values[10] = Int64GetDatum((int64) pg_atomic_read_u64(&w->lost_leases));
        values[11] = Int32GetDatum((int32) pg_atomic_read_u32(&w->in_flight));
        values[12] = Int64GetDatum((int64) pg_atomic_read_u64(&w->cycles));
        values[13] = Float8GetDatum(count ? (double) pg_atomic_read_u64(&w->latency_sum_us) / count / 1000.0 : 0);
        nulls[13] = (count == 0);
        values[14] = Float8GetDatum(od::latency_percentile_ms(buckets, count, 0.50));
        nulls[14] = (count == 0);
        values[15] = Float8GetDatum(od::latency_percentile_ms(buckets, count, 0.99));
        nulls[15] = (count == 0);
        values[16] = Float8GetDatum((double) pg_atomic_read_u64(&w->latency_max_us) / 1000.0);
        nulls[16] = (count == 0);
        values[17] = CStringGetTextDatum(last_error);
        nulls[17] = (last_error[0] == '\0');
        values[18] = TimestampTzGetDatum(last_error_at);
        nulls[18] = (last_error_at == 0);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum) 0;
}

/*
 * outbox._endpoint_health(): one row per endpoint known to the workers'
 * shared state (breaker, cluster-wide in-flight count, delivery statistics).
 * The view outbox.endpoint_health joins it to outbox.endpoints by the slot's
 * key (the table's oid and the endpoint id).  Two shapes: the 0.2.0 one
 * (first column the name, as far as the slot keeps it) for a schema that
 * was not updated yet, the 0.2.1 one (relid, id, then the same columns),
 * and the 0.3.0 one (that, then failing_since).
 */
extern "C" {
PG_FUNCTION_INFO_V1(od_endpoint_health_sql);
PG_FUNCTION_INFO_V1(od_endpoint_health_v2_sql);
PG_FUNCTION_INFO_V1(od_endpoint_health_v3_sql);
PG_FUNCTION_INFO_V1(od_endpoints_unserved_sql);
}

static const char *const breaker_names[] = { "closed", "open", "half_open" };

static void
endpoint_health_rows(FunctionCallInfo fcinfo, bool keyed, bool failing)
{
    ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
    int            off = keyed ? 2 : 1;

    InitMaterializedSRF(fcinfo, 0);
    if (od_shared == nullptr)
        return;
    for (int i = 0; i < od_shared->max_endpoints; i++)
    {
        OdEndpointSlot *e = &od_endpoint_slots()[i];
        OdEndpointSlot  c;
        Datum           values[19];
        bool            nulls[19];

        if (!e->used)
            continue;
        SpinLockAcquire(&e->mutex);
        memcpy(&c, e, sizeof(c));
        SpinLockRelease(&e->mutex);
        if (!c.used)
            continue;
        memset(nulls, 0, sizeof(nulls));
        if (keyed)
        {
            values[0] = ObjectIdGetDatum(c.relid);
            values[1] = Int64GetDatum(c.id);
        }
        else
            values[0] = CStringGetTextDatum(c.label);
        values[off + 0] = CStringGetTextDatum(breaker_names[c.breaker >= 0 && c.breaker <= 2 ? c.breaker : 0]);
        values[off + 1] = Int32GetDatum(c.consecutive_failures);
        values[off + 2] = Int32GetDatum(c.trips);
        values[off + 3] = TimestampTzGetDatum(c.opened_at);
        nulls[off + 3] = (c.breaker == OD_BREAKER_CLOSED || c.opened_at == 0);
        values[off + 4] = TimestampTzGetDatum(c.next_probe_at);
        nulls[off + 4] = (c.breaker == OD_BREAKER_CLOSED || c.next_probe_at == 0);
        values[off + 5] = Int32GetDatum(c.in_flight);
        values[off + 6] = Int32GetDatum(c.last_status);
        nulls[off + 6] = (c.last_status == 0);
        values[off + 7] = CStringGetTextDatum(c.last_error);
        nulls[off + 7] = (c.last_error[0] == '\0');
        values[off + 8] = TimestampTzGetDatum(c.last_success_at);
        nulls[off + 8] = (c.last_success_at == 0);
        values[off + 9] = TimestampTzGetDatum(c.last_failure_at);
        nulls[off + 9] = (c.last_failure_at == 0);
        values[off + 10] = Int64GetDatum((int64) c.delivered);
        values[off + 11] = Int64GetDatum((int64) c.failed);
        values[off + 12] = Float8GetDatum(c.latency_count ? (double) c.latency_sum_us / c.latency_count / 1000.0 : 0);
        nulls[off + 12] = (c.latency_count == 0);
        values[off + 13] = Float8GetDatum(od::latency_percentile_ms(c.latency_buckets, c.latency_count, 0.50));
        nulls[off + 13] = (c.latency_count == 0);
        values[off + 14] = Float8GetDatum(od::latency_percentile_ms(c.latency_buckets, c.latency_count, 0.99));
        nulls[off + 14] = (c.latency_count == 0);
        values[off + 15] = Float8GetDatum((double) c.latency_max_us / 1000.0);
        nulls[off + 15] = (c.latency_count == 0);
        if (failing)
        {
            values[off + 16] = TimestampTzGetDatum(c.failing_since);
            nulls[off + 16] = (c.failing_since == 0);
        }
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
}

extern "C" Datum
od_endpoint_health_sql(PG_FUNCTION_ARGS)
{
    endpoint_health_rows(fcinfo, false, false);
    return (Datum) 0;
}

extern "C" Datum
od_endpoint_health_v2_sql(PG_FUNCTION_ARGS)
{
    endpoint_health_rows(fcinfo, true, false);
    return (Datum) 0;
}

/* 0.3.0: the 0.2.1 shape and failing_since (what disable_after is measured from) */
extern "C" Datum
od_endpoint_health_v3_sql(PG_FUNCTION_ARGS)
{
    endpoint_health_rows(fcinfo, true, true);
    return (Datum) 0;
}

/* outbox._endpoints_unserved(): enabled endpoints the workers found no slot for at their last refresh. */
extern "C" Datum
od_endpoints_unserved_sql(PG_FUNCTION_ARGS)
{
    if (od_shared == nullptr)
        PG_RETURN_NULL();
    PG_RETURN_INT32((int32) pg_atomic_read_u32(&od_shared->endpoints_unserved));
}

/*
 * outbox._replication_wait(): deliver_after_replication — the workers
 * waiting for the synchronous standbys to confirm a claim (or to come back
 * after one they did not confirm), the claimed messages they hold back, and
 * since when the oldest wait runs.
 */
extern "C" Datum
od_replication_wait_sql(PG_FUNCTION_ARGS)
{
    TupleDesc   desc;
    Datum       values[3];
    bool        nulls[3] = { false, false, false };
    int32       waiting = 0;
    int64       held = 0;
    TimestampTz oldest = 0;

    if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
        ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED), errmsg("return type must be a row type")));
    for (int i = 0; od_shared != nullptr && i < od_workers && i < OD_MAX_WORKERS; i++)
    {
        OdWorkerSlot *w = &od_shared->workers[i];
        TimestampTz   since = (TimestampTz) pg_atomic_read_u64(&w->replication_wait_since);

        if (w->pid == 0 || since == 0)
            continue;
        waiting++;
        held += pg_atomic_read_u32(&w->replication_held);
        if (oldest == 0 || since < oldest)
            oldest = since;
    }
    values[0] = Int32GetDatum(waiting);
    values[1] = Int64GetDatum(held);
    values[2] = TimestampTzGetDatum(oldest);
    nulls[2] = (oldest == 0);
    PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
