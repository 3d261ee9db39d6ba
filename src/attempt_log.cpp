/*
 * attempt_log.cpp — writing outbox.attempts and emptying its old days.
 * See attempt_log.h and core/attempt_log.hpp.
 */
#include "attempt_log.h"
#include "guard.h"
#include "transitions.h"
#include "core/attempt_log.hpp"

extern "C" {
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/timestamp.h"
}

#include "pg_compat.h"

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

/* The columns of outbox.attempts in table order, as od_log_attempts fills them. */
static const struct
{
    const char *name;
    Oid         type;
} kColumns[13] = {
    { "message_id", INT8OID },     { "lease_version", INT8OID }, { "attempt", INT4OID },
    { "endpoint", TEXTOID },       { "worker", INT4OID },        { "started_at", TIMESTAMPTZOID },
    { "duration_ms", FLOAT8OID },  { "outcome", TEXTOID },       { "http_status", INT4OID },
    { "error_class", TEXTOID },    { "retry_after", TEXTOID },   { "response_body", TEXTOID },
    { "bucket", INT2OID },
};
static const AttrNumber kBucketAttno = 13;

/* The table's columns are exactly kColumns (none dropped, added or generated). */
static bool
layout_is_ours(TupleDesc desc)
{
    if (desc->natts != lengthof(kColumns))
        return false;
    for (int i = 0; i < desc->natts; i++)
    {
        Form_pg_attribute a = TupleDescAttr(desc, i);

        if (a->attisdropped || a->attgenerated != '\0' || a->atttypid != kColumns[i].type ||
            strcmp(NameStr(a->attname), kColumns[i].name) != 0)
            return false;
    }
    return true;
}

/* The partition of `parent` (LIST on bucket) that holds `bucket`; InvalidOid if none or another scheme. */
static Oid
partition_of_bucket(Relation parent, int16 bucket)
{
    PartitionKey       key = RelationGetPartitionKey(parent);
    PartitionDesc      pd = RelationGetPartitionDesc(parent, true);
    PartitionBoundInfo b = pd->boundinfo;

    if (key->strategy != PARTITION_STRATEGY_LIST || key->partnatts != 1 || key->partattrs[0] != kBucketAttno ||
        b == nullptr)
        return InvalidOid;
    for (int i = 0; i < b->ndatums; i++)
        if (DatumGetInt16(b->datums[i][0]) == bucket && b->indexes[i] >= 0)
            return pd->oids[b->indexes[i]];
    return InvalidOid;
}

/* The rows into part (opened in rri with its indexes): the heap, then each row's index entries. */
static void
write_rows(Relation part, ResultRelInfo *rri, EState *estate, Datum *const *cols, bool *const *nulls, int n)
{
    TupleDesc        desc = RelationGetDescr(part);
    TupleTableSlot **slots = (TupleTableSlot **) palloc(sizeof(TupleTableSlot *) * n);

    for (int i = 0; i < n; i++)
    {
        slots[i] = MakeSingleTupleTableSlot(desc, table_slot_callbacks(part));
        for (int c = 0; c < desc->natts; c++)
        {
            slots[i]->tts_values[c] = cols[c][i];
            slots[i]->tts_isnull[c] = nulls[c][i];
        }
        ExecStoreVirtualTuple(slots[i]);
        if (desc->constr != nullptr)
            ExecConstraints(rri, slots[i], estate);
    }
    table_multi_insert(part, slots, n, GetCurrentCommandId(true), 0, nullptr);
    for (int i = 0; i < n; i++)
    {
        ResetPerTupleExprContext(estate);
        od_insert_index_tuples(rri, slots[i], estate);
        ExecDropSingleTupleTableSlot(slots[i]);
    }
    pfree(slots);
}

/*
 * The rows of one bucket written straight into its partition, as COPY does:
 * one heap_multi_insert (one WAL record per page instead of one per row),
 * then each row's index entries; no statement to plan, start and route.
 * Only where that is exactly what the INSERT through outbox.attempts would
 * do: the worker's role may insert into it, no row-level security, no
 * trigger or rule, no CHECK constraint, no deferred unique index, the table as the
 * extension made it, and a partition (a plain table) found for the bucket.
 * Otherwise false, having written nothing, and the caller runs the INSERT
 * (which then also raises whatever error applies).  NOT NULL is checked
 * here as the INSERT would (ExecConstraints).
 */
static bool
insert_direct(Datum *const *cols, bool *const *nulls, int n, int16 bucket)
{
    Oid      nsp = get_namespace_oid("outbox", true);
    Oid      parent_oid = OidIsValid(nsp) ? get_relname_relid("attempts", nsp) : InvalidOid;
    Relation parent;
    Relation part = nullptr;
    Oid      part_oid = InvalidOid;
    bool     usable;

    if (!OidIsValid(parent_oid) || pg_class_aclcheck(parent_oid, GetUserId(), ACL_INSERT) != ACLCHECK_OK ||
        check_enable_rls(parent_oid, InvalidOid, true) == RLS_ENABLED)
        return false;
    parent = table_open(parent_oid, RowExclusiveLock);
    if (parent->rd_rel->relkind == RELKIND_PARTITIONED_TABLE && parent->trigdesc == nullptr && parent->rd_rules == nullptr &&
        layout_is_ours(RelationGetDescr(parent)))
        part_oid = partition_of_bucket(parent, bucket);
    if (OidIsValid(part_oid))
        part = table_open(part_oid, RowExclusiveLock);
    usable = part != nullptr && part->rd_rel->relkind == RELKIND_RELATION && part->trigdesc == nullptr &&
             layout_is_ours(RelationGetDescr(part)) &&
             (part->rd_att->constr == nullptr || part->rd_att->constr->num_check == 0);
    if (usable)
    {
        EState        *estate = CreateExecutorState();
        ResultRelInfo *rri = makeNode(ResultRelInfo);

        InitResultRelInfo(rri, part, 0, nullptr, 0);
        ExecOpenIndices(rri, false);
        for (int i = 0; i < rri->ri_NumIndices; i++)
            if (!rri->ri_IndexRelationDescs[i]->rd_index->indimmediate)
                usable = false; /* a deferred unique check would need an after-trigger event */
        if (usable)
            write_rows(part, rri, estate, cols, nulls, n);
        ExecCloseIndices(rri);
        FreeExecutorState(estate);
    }
    if (part != nullptr)
        table_close(part, NoLock);
    table_close(parent, NoLock);
    if (usable)
        CommandCounterIncrement();
    return usable;
}

void
od_log_attempts(const OdAttempt *rows, int n)
{
    Datum           *cols[lengthof(kColumns)];
    bool            *nulls[lengthof(kColumns)];
    Datum            args[lengthof(kColumns)];
    Oid              types[lengthof(kColumns)];
    int              rc;

    if (n <= 0)
        return;
    for (int c = 0; c < (int) lengthof(kColumns); c++)
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
        cols[kBucketAttno - 1][i] = Int16GetDatum((int16) od::attempt_bucket(od::attempt_day(unix_us)));
    }
    {
        const Datum *bucket = cols[kBucketAttno - 1];
        bool         one_bucket = true;

        for (int i = 1; i < n && one_bucket; i++)
            one_bucket = DatumGetInt16(bucket[i]) == DatumGetInt16(bucket[0]);
        if (one_bucket && insert_direct(cols, nulls, n, DatumGetInt16(bucket[0])))
            return;
    }
    for (int c = 0; c < (int) lengthof(kColumns); c++)
        args[c] = PointerGetDatum(od_build_array(cols[c], nulls[c], n, kColumns[c].type));
    if (plan_log == nullptr)
    {
        /* the statement's parameters are arrays of the columns' types (in its text as well) */
        for (int c = 0; c < (int) lengthof(kColumns); c++)
            types[c] = get_array_type(kColumns[c].type);
        od_prepare(&plan_log, SQL_LOG_ATTEMPTS, lengthof(kColumns), types);
    }
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
