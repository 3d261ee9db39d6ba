/*
 * triggers.cpp — row validation for outbox.messages and outbox.endpoints.
 *
 * Validation lives in BEFORE ROW triggers rather than in enqueue() so that
 * a plain INSERT INTO outbox.messages (a supported way to enqueue) and
 * direct edits of outbox.endpoints get the very same checks.  Everything
 * that will become an HTTP header (event_type -> ce-type, aggregate ->
 * ce-subject, user headers) is checked for CR/LF and control characters
 * here, so that a row that made it into the table can always be sent.
 *
 * The byte-level checks are in src/core/validate.cpp (pure C++, unit
 * tested); this file walks PostgreSQL values and raises the errors.
 */
#include "outbox_dispatcher.h"
#include "module.h"
#include "guard.h"
#include "core/pattern.hpp"
#include "core/validate.hpp"
#include "triggers.h"

extern "C" {
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "commands/async.h"
#include "commands/trigger.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/xid8.h"

PG_FUNCTION_INFO_V1(od_message_check);
PG_FUNCTION_INFO_V1(od_message_xid_first);
PG_FUNCTION_INFO_V1(od_endpoint_check);
PG_FUNCTION_INFO_V1(od_endpoint_disabled_trigger);
PG_FUNCTION_INFO_V1(od_endpoint_check_v030);
PG_FUNCTION_INFO_V1(od_subscription_check);
PG_FUNCTION_INFO_V1(od_message_status_valid);
PG_FUNCTION_INFO_V1(od_message_lease_valid);
}

/*
 * Quote user input for an error message: control characters are shown as
 * \r, \n, \t or \xNN so that a rejected CR/LF never reaches the log raw.
 */
static char *
printable(const char *s, size_t len)
{
    StringInfoData buf;

    initStringInfo(&buf);
    for (size_t i = 0; i < len; i++)
    {
        unsigned char c = (unsigned char) s[i];

        if (c == '\r')
            appendStringInfoString(&buf, "\\r");
        else if (c == '\n')
            appendStringInfoString(&buf, "\\n");
        else if (c == '\t')
            appendStringInfoString(&buf, "\\t");
        else if (c < 0x20 || c == 0x7f)
            appendStringInfo(&buf, "\\x%02X", c);
        else
            appendStringInfoChar(&buf, (char) c);
    }
    return buf.data;
}

static TriggerData *
row_trigger_data(FunctionCallInfo fcinfo, const char *fname)
{
    TriggerData *trig = (TriggerData *) fcinfo->context;

    if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trig->tg_event) || !TRIGGER_FIRED_FOR_ROW(trig->tg_event))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"%s\" must be fired BEFORE ROW", fname)));
    return trig;
}

static HeapTuple
new_row(TriggerData *trig)
{
    return TRIGGER_FIRED_BY_UPDATE(trig->tg_event) ? trig->tg_newtuple : trig->tg_trigtuple;
}

static Datum
column(TriggerData *trig, HeapTuple tup, const char *name, bool *isnull)
{
    TupleDesc desc = RelationGetDescr(trig->tg_relation);
    int       attno = SPI_fnumber(desc, name);

    if (attno <= 0)
        elog(ERROR, "outbox_dispatcher: column \"%s\" not found", name);
    return heap_getattr(tup, attno, desc, isnull);
}

/*
 * A required column left null, reported before the NOT NULL constraint
 * would: that constraint's error quotes the whole row in its DETAIL
 * ("Failing row contains (...)"), which would put signing_secret, headers
 * and payloads into the server log.
 */
static void
reject_nulls(TriggerData *trig, HeapTuple tup)
{
    TupleDesc desc = RelationGetDescr(trig->tg_relation);

    for (int i = 0; i < desc->natts; i++)
    {
        Form_pg_attribute att = TupleDescAttr(desc, i);

        if (att->attnotnull && !att->attisdropped && att->attgenerated == '\0' && heap_attisnull(tup, i + 1, desc))
            ereport(ERROR,
                    (errcode(ERRCODE_NOT_NULL_VIOLATION),
                     errmsg("null value in column \"%s\" of relation \"%s\" violates not-null constraint",
                            NameStr(att->attname), RelationGetRelationName(trig->tg_relation))));
    }
}

/* A signing secret (text): see od::check_signing_secret; the error names colname, never the value. */
void
od_check_secret_value(Datum d, const char *colname)
{
    text       *t = DatumGetTextPP(d);
    const char *problem = od::check_signing_secret(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));

    if (problem)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s %s", colname, problem),
                 errhint("Use a Standard Webhooks secret: \"whsec_\" followed by base64 of 16 to 256 random bytes (24 "
                         "to 64 recommended).")));
}

/* A text value that will be sent as (part of) an HTTP header value. */
void
od_check_header_safe_value(Datum d, const char *colname, bool allow_empty)
{
    text       *t = DatumGetTextPP(d);
    const char *problem;

    if (!allow_empty && VARSIZE_ANY_EXHDR(t) == 0)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must not be empty", colname)));
    problem = od::check_header_value(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
    if (problem)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s %s", colname, problem),
                 errdetail("It is sent in an HTTP header.")));
}

/* A text column that will be sent as (part of) an HTTP header value. */
static void
check_header_safe_text(TriggerData *trig, HeapTuple tup, const char *colname, bool allow_empty)
{
    bool  isnull;
    Datum d = column(trig, tup, colname, &isnull);

    if (isnull)
        return; /* NOT NULL constraints report this */
    od_check_header_safe_value(d, colname, allow_empty);
}

/* Does the JSON object have a key equal to name (ASCII case-insensitive)? */
static bool
jsonb_has_key_ci(Jsonb *jb, const char *name)
{
    JsonbIterator     *it;
    JsonbValue         v;
    JsonbIteratorToken tok;
    size_t             n = strlen(name);

    if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
        return false;
    it = JsonbIteratorInit(&jb->root);
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
        if (tok == WJB_KEY && (size_t) v.val.string.len == n && pg_strncasecmp(v.val.string.val, name, n) == 0)
            return true;
    return false;
}

/*
 * headers must be a JSON object whose values are all strings; names must be
 * header tokens not reserved by the dispatcher, values free of CR/LF and
 * control characters.
 */
static void
check_headers_object(Jsonb *jb, const char *what)
{
    JsonbIterator     *it;
    JsonbValue         v;
    JsonbIteratorToken tok;
    char              *name = nullptr;
    int                count = 0;
    int64              bytes = 0;

    if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must be a JSON object of strings", what),
                 errdetail("Example: {\"Authorization\": \"Bearer ...\"}.")));

    it = JsonbIteratorInit(&jb->root);
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
    {
        const char *problem;

        if (tok == WJB_KEY)
        {
            count++;
            bytes += v.val.string.len;
            if (count > od_max_headers)
                ereport(ERROR,
                        (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("%s: too many headers", what),
                         errdetail("outbox_dispatcher.max_headers is %d.", od_max_headers)));
            name = printable(v.val.string.val, v.val.string.len);
            problem = od::check_header_name(v.val.string.val, v.val.string.len);
            if (problem)
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("%s: header name \"%s\" %s", what, name, problem)));
            if (od::header_name_is_reserved(v.val.string.val, v.val.string.len))
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("%s: header \"%s\" is set by the dispatcher and cannot be overridden", what, name)));
        }
        else if (tok == WJB_VALUE)
        {
            if (v.type != jbvString)
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s must be a JSON object of strings", what),
                         errdetail("The value of header \"%s\" is not a string.", name)));
            problem = od::check_header_value(v.val.string.val, v.val.string.len);
            /* trace context: the W3C formats (also sent as CloudEvents attributes) */
            if (!problem && pg_strcasecmp(name, "traceparent") == 0)
                problem = od::check_traceparent(v.val.string.val, v.val.string.len);
            else if (!problem && pg_strcasecmp(name, "tracestate") == 0)
                problem = od::check_tracestate(v.val.string.val, v.val.string.len);
            if (problem)
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("%s: value of header \"%s\" %s", what, name, problem)));
            bytes += v.val.string.len;
            if (bytes > od_max_header_bytes)
                ereport(
                    ERROR,
                    (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("%s are too large", what),
                     errdetail(
                         "Header names and values add up to more than outbox_dispatcher.max_header_bytes (%d bytes).",
                         od_max_header_bytes)));
        }
    }
}

/* ---------------------------------------------------------------- messages */

/* Does the headers object have a key `name` in any letter case? */
static bool
has_header(Jsonb *jb, const char *name)
{
    JsonbIterator     *it;
    JsonbValue         v;
    JsonbIteratorToken tok;
    size_t             len = strlen(name);
    bool               found = false;

    if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
        return false; /* check_headers_object reports it */
    it = JsonbIteratorInit(&jb->root);
    while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
        if (tok == WJB_KEY && (size_t) v.val.string.len == len && pg_strncasecmp(v.val.string.val, name, len) == 0)
            found = true;
    return found;
}

/*
 * The transaction's trace context (outbox_dispatcher.traceparent, and
 * .tracestate with it), set by the producer, goes into a new message's
 * headers unless the message brings a traceparent of its own.  Both were
 * validated when they were set; the headers are checked after this, with
 * their limits.
 */
static HeapTuple
capture_trace_context(TriggerData *trig, HeapTuple tup)
{
    TupleDesc      desc = RelationGetDescr(trig->tg_relation);
    int            attno = SPI_fnumber(desc, "headers");
    bool           isnull;
    Datum          headers;
    StringInfoData buf;
    Datum          add;
    bool           nnull = false;

    if (od_traceparent == nullptr || od_traceparent[0] == '\0' || attno <= 0)
        return tup;
    headers = heap_getattr(tup, attno, desc, &isnull);
    if (!isnull && has_header(DatumGetJsonbP(headers), "traceparent"))
        return tup;
    initStringInfo(&buf);
    appendStringInfoString(&buf, "{\"traceparent\": ");
    escape_json(&buf, od_traceparent);
    if (od_tracestate && od_tracestate[0] != '\0' && (isnull || !has_header(DatumGetJsonbP(headers), "tracestate")))
    {
        appendStringInfoString(&buf, ", \"tracestate\": ");
        escape_json(&buf, od_tracestate);
    }
    appendStringInfoChar(&buf, '}');
    add = DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
    if (!isnull)
        add = DirectFunctionCall2(jsonb_concat, headers, add);
    return heap_modify_tuple_by_cols(tup, desc, 1, &attno, &add, &nnull);
}

/*
 * An ordered message's ordered_after (0.3.0; absent before), unless the row
 * comes with one: the next xid as of now, after the row's id was drawn.
 * Every transaction that drew a lower id had its xid before
 * (messages_xid_first), so below this value;
 * the claim takes the message only once every xid below it has ended, so
 * that a lower id of the same aggregate committed by a slower producer is
 * seen first (transitions.cpp, ORDERED_AFTER_OLDER_TRANSACTIONS).
 */
static HeapTuple
record_commit_order(TriggerData *trig, HeapTuple tup)
{
    TupleDesc desc = RelationGetDescr(trig->tg_relation);
    int       attno = SPI_fnumber(desc, "ordered_after");
    bool      isnull;
    Datum     ordered;
    Datum     value;
    bool      value_null = false;

    if (attno <= 0)
        return tup; /* a schema before 0.3.0 */
    /*
     * A value given with the row is kept: producers cannot write the column
     * (it is not in their INSERT grant), so it comes from a restore — of this
     * cluster, or of another one, whose values the claim recognizes as not of
     * this cluster's (beyond the next xid) and does not wait for.
     */
    (void) heap_getattr(tup, attno, desc, &isnull);
    if (!isnull)
        return tup;
    ordered = column(trig, tup, "ordered", &isnull);
    if (isnull || !DatumGetBool(ordered))
        return tup;               /* unordered: nothing to wait for */
    (void) GetTopTransactionId(); /* a row inserted with the statement trigger disabled */
    value = FullTransactionIdGetDatum(ReadNextFullTransactionId());
    return heap_modify_tuple_by_cols(tup, desc, 1, &attno, &value, &value_null);
}

/* The payload as sent (its JSON text) within max_payload_bytes. */
static void
check_payload_size(Datum d)
{
    Jsonb *jb = DatumGetJsonbP(d);
    char  *body = JsonbToCString(nullptr, &jb->root, VARSIZE(jb));
    size_t len = strlen(body);

    if (len > (size_t) od_max_payload_bytes)
        ereport(ERROR,
                (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("payload is too large: %zu bytes", len),
                 errdetail("outbox_dispatcher.max_payload_bytes is %d bytes.", od_max_payload_bytes)));
    pfree(body);
}

/*
 * available_at: a finite time, at most max_schedule_ahead from now.  An
 * ordered message holds back every later message of its aggregate until
 * it is done, so 'infinity' (or the year 9999) would block the aggregate
 * for good.  Checked on INSERT; the workers' own reschedules are bounded
 * by backoff_cap and max_defer_age.
 */
static void
check_available_at(Datum d)
{
    TimestampTz at = DatumGetTimestampTz(d);
    TimestampTz limit = GetCurrentTimestamp() + (int64) od_max_schedule_ahead_s * USECS_PER_SEC;

    if (TIMESTAMP_NOT_FINITE(at))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("available_at must be a finite time"),
                 errdetail("The value given is %s.", DatumGetCString(DirectFunctionCall1(timestamptz_out, d)))));
    if (at > limit)
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("available_at is too far in the future"),
                 errdetail("The value given is %s, more than outbox_dispatcher.max_schedule_ahead (%s) from now.",
                           DatumGetCString(DirectFunctionCall1(timestamptz_out, d)),
                           GetConfigOptionByName("outbox_dispatcher.max_schedule_ahead", nullptr, false))));
}

void
od_check_message_values(Datum aggregate_type, Datum aggregate_id, Datum event_type, Datum payload, Datum headers,
                        bool headers_null, Datum available_at, bool available_at_null)
{
    od_check_header_safe_value(aggregate_type, "aggregate_type", false);
    od_check_header_safe_value(aggregate_id, "aggregate_id", false);
    od_check_header_safe_value(event_type, "event_type", false);
    if (!headers_null)
        check_headers_object(DatumGetJsonbP(headers), "message headers");
    check_payload_size(payload);
    if (!available_at_null)
        check_available_at(available_at);
}

/*
 * The CHECK constraints of outbox.messages: messages_status_check is
 * _message_status_valid(status), messages_lease_check is
 * _message_lease_valid(status, lease_until) (why C functions: see
 * _message_status_valid in the extension script).  As the SQL expressions
 * they replace: a NULL status gives NULL (the constraint holds; status is
 * NOT NULL anyway), and the comparison is of bytes, as text = text is
 * under the deterministic collations a database can have.
 */
extern "C" Datum
od_message_status_valid(PG_FUNCTION_ARGS)
{
    text *status;

    if (PG_ARGISNULL(0))
        PG_RETURN_NULL();
    status = PG_GETARG_TEXT_PP(0);
    PG_RETURN_BOOL(od::message_status_is_valid(VARDATA_ANY(status), VARSIZE_ANY_EXHDR(status)));
}

extern "C" Datum
od_message_lease_valid(PG_FUNCTION_ARGS)
{
    text *status;

    if (PG_ARGISNULL(0))
        PG_RETURN_NULL();
    status = PG_GETARG_TEXT_PP(0);
    PG_RETURN_BOOL(
        od::message_lease_is_consistent(VARDATA_ANY(status), VARSIZE_ANY_EXHDR(status), !PG_ARGISNULL(1)));
}

/*
 * messages_check (BEFORE INSERT, ROW) checks and completes every new row;
 * messages_check_update (AFTER UPDATE OF the wire columns, ROW) checks an
 * update of those columns: an error there undoes the statement all the
 * same.  The update check is an AFTER trigger because any BEFORE ROW UPDATE
 * trigger, even one whose columns an UPDATE does not name, makes the
 * executor lock each row before updating it: one more WAL record for each
 * message the workers finalize.
 */
extern "C" Datum
od_message_check(PG_FUNCTION_ARGS)
{
    TriggerData *trig = (TriggerData *) fcinfo->context;
    HeapTuple    tup;
    bool         isnull;
    Datum        d;

    /* (schemas before 0.3.0 fire it BEFORE UPDATE: checked the same way) */
    if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_FOR_ROW(trig->tg_event) ||
        !(TRIGGER_FIRED_BY_UPDATE(trig->tg_event) ||
          (TRIGGER_FIRED_BY_INSERT(trig->tg_event) && TRIGGER_FIRED_BEFORE(trig->tg_event))))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"%s\" must be fired BEFORE INSERT or on UPDATE, for each row",
                        "_message_check")));
    tup = new_row(trig);
    reject_nulls(trig, tup);

    check_header_safe_text(trig, tup, "aggregate_type", false);
    check_header_safe_text(trig, tup, "aggregate_id", false);
    check_header_safe_text(trig, tup, "event_type", false);

    if (TRIGGER_FIRED_BY_INSERT(trig->tg_event))
        tup = capture_trace_context(trig, tup);
    d = column(trig, tup, "headers", &isnull);
    if (!isnull)
        check_headers_object(DatumGetJsonbP(d), "message headers");

    d = column(trig, tup, "payload", &isnull);
    if (!isnull)
        check_payload_size(d);

    /* available_at: checked on INSERT (check_available_at) */
    if (TRIGGER_FIRED_BY_INSERT(trig->tg_event))
    {
        d = column(trig, tup, "available_at", &isnull);
        if (!isnull)
            check_available_at(d);
        tup = record_commit_order(trig, tup);
    }
    return PointerGetDatum(tup);
}

/*
 * Statement trigger messages_xid_first (0.3.0), BEFORE INSERT: the
 * inserting transaction has an xid before the statement draws any message
 * id (a BEFORE STATEMENT trigger fires before the first row is formed, so
 * before its identity default runs).  Then every transaction holding a
 * message id has an xid older than the next xid read after that id was
 * drawn — what record_commit_order stores and the claim waits for.
 */
extern "C" Datum
od_message_xid_first(PG_FUNCTION_ARGS)
{
    TriggerData *trig = (TriggerData *) fcinfo->context;

    if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trig->tg_event) || TRIGGER_FIRED_FOR_ROW(trig->tg_event))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"%s\" must be fired BEFORE STATEMENT", "_message_xid_first")));
    (void) GetTopTransactionId();
    return PointerGetDatum(nullptr);
}

/* ---------------------------------------------------------------- endpoints */

/*
 * The ranges of schemas before 0.3.0, which has them as named domain
 * constraints instead (sql/outbox_dispatcher--0.2.2--0.3.0.sql).  Delete
 * with 0.2.2's support (catalog.h).
 */
static void
check_ranges_before_030(TriggerData *trig, HeapTuple tup)
{
    bool  isnull;
    Datum d;

    /* max_in_flight */
    d = column(trig, tup, "max_in_flight", &isnull);
    if (!isnull && (DatumGetInt32(d) < 1 || DatumGetInt32(d) > 10000))
        ereport(ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("max_in_flight must be between 1 and 10000"),
                 errdetail("The value given is %d.", DatumGetInt32(d))));

    /* defer_statuses */
    d = column(trig, tup, "defer_statuses", &isnull);
    if (!isnull)
    {
        ArrayType *arr = DatumGetArrayTypeP(d);
        Datum     *elems;
        bool      *enulls;
        int        n;

        if (ARR_NDIM(arr) > 1)
            ereport(
                ERROR,
                (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("defer_statuses must be a one-dimensional array")));
        deconstruct_array(arr, INT4OID, 4, true, TYPALIGN_INT, &elems, &enulls, &n);
        for (int i = 0; i < n; i++)
        {
            int s = enulls[i] ? 0 : DatumGetInt32(elems[i]);

            if (enulls[i] || s < 300 || s > 599)
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("defer_statuses must contain HTTP statuses between 300 and 599"),
                         errdetail("Element %d is %s.", i + 1, enulls[i] ? "null" : psprintf("%d", s))));
        }
    }

    /* limits added in 0.2.0: absent from 0.1.0 tables */
    if (SPI_fnumber(RelationGetDescr(trig->tg_relation), "rate_limit") > 0)
    {
        d = column(trig, tup, "rate_limit", &isnull);
        if (!isnull && !(DatumGetFloat8(d) >= 0.0001 && DatumGetFloat8(d) <= 1e6))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("rate_limit must be between 0.0001 and 1000000 messages per second, or null for no limit"),
                     errdetail("The value given is %s.", DatumGetCString(DirectFunctionCall1(float8out, d)))));
        d = column(trig, tup, "breaker_threshold", &isnull);
        if (!isnull && (DatumGetInt32(d) < 0 || DatumGetInt32(d) > 1000000))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("breaker_threshold must be between 0 (no circuit breaker) and 1000000"),
                     errdetail("The value given is %d.", DatumGetInt32(d))));
        d = column(trig, tup, "breaker_cooldown", &isnull);
        if (!isnull &&
            (od_interval_us(DatumGetIntervalP(d)) < USECS_PER_SEC / 10 ||
             od_interval_us(DatumGetIntervalP(d)) > (int64) 3600 * USECS_PER_SEC))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("breaker_cooldown must be between 100 milliseconds and 1 hour"),
                     errdetail("The value given is %s.", DatumGetCString(DirectFunctionCall1(interval_out, d)))));
    }
}

static Datum
endpoint_check(FunctionCallInfo fcinfo, bool ranges_in_c)
{
    TriggerData *trig = row_trigger_data(fcinfo, "_endpoint_check");
    HeapTuple    tup = new_row(trig);
    TupleDesc    desc = RelationGetDescr(trig->tg_relation);
    bool         isnull;
    Datum        d;
    const char  *problem;

    reject_nulls(trig, tup);

    /* name: shown in logs and errors */
    d = column(trig, tup, "name", &isnull);
    if (!isnull)
    {
        text *t = DatumGetTextPP(d);

        if (VARSIZE_ANY_EXHDR(t) == 0)
            ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("endpoint name must not be empty")));
        if (od::check_header_value(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("endpoint name must not contain control characters")));
    }

    /* url */
    d = column(trig, tup, "url", &isnull);
    if (!isnull)
    {
        text *t = DatumGetTextPP(d);

        problem = od::check_url(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
        if (problem)
        {
            /* never echo credentials: user information in the URL is shown as *** */
            size_t len = VARSIZE_ANY_EXHDR(t);
            char  *shown = (char *) palloc(len + 8);

            od::redact_url(VARDATA_ANY(t), len, shown, len + 8);
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("endpoint URL %s", problem),
                     errdetail("The URL given is \"%s\".", printable(shown, strlen(shown))),
                     errhint("Only http:// and https:// URLs are supported.")));
        }
    }

    /* headers */
    d = column(trig, tup, "headers", &isnull);
    if (!isnull)
        check_headers_object(DatumGetJsonbP(d), "endpoint headers");

    /* 0.3.0: proxy, TLS client certificate and key (both or neither); errors never quote them */
    if (SPI_fnumber(RelationGetDescr(trig->tg_relation), "proxy") > 0)
    {
        bool  cert_null, key_null;
        Datum cert = column(trig, tup, "client_cert", &cert_null);
        Datum key = column(trig, tup, "client_key", &key_null);

        d = column(trig, tup, "proxy", &isnull);
        if (!isnull)
        {
            text *t = DatumGetTextPP(d);

            problem = od::check_proxy_url(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
            if (problem)
                ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("proxy %s", problem)));
        }
        if (cert_null != key_null)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("client_cert and client_key must be set together"),
                     errdetail("TLS client authentication needs the certificate and its private key.")));
        if (!cert_null)
        {
            text *t = DatumGetTextPP(cert);

            problem = od::check_pem(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), false);
            if (problem)
                ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("client_cert %s", problem)));
            t = DatumGetTextPP(key);
            problem = od::check_pem(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), true);
            if (problem)
                ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("client_key %s", problem)));
        }
    }

    /*
     * 0.3.0: OAuth 2.0 client credentials: token URL, client id and secret
     * together, the scope optional; the workers set Authorization, so the
     * endpoint's headers may not.  Errors never quote the id, secret or scope.
     */
    if (SPI_fnumber(RelationGetDescr(trig->tg_relation), "oauth_token_url") > 0)
    {
        static const char *const parts[4] = { "oauth_token_url", "oauth_client_id", "oauth_client_secret",
                                              "oauth_scope" };
        Datum                    v[4];
        bool                     vnull[4];

        for (int i = 0; i < 4; i++)
            v[i] = column(trig, tup, parts[i], &vnull[i]);
        if (vnull[0] != vnull[1] || vnull[1] != vnull[2] || (vnull[0] && !vnull[3]))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("oauth_token_url, oauth_client_id and oauth_client_secret must be set together"),
                     errdetail("OAuth 2.0 client credentials need the token URL, the client id and the client secret; "
                               "oauth_scope is optional, and only with them.")));
        if (!vnull[0])
        {
            text *t = DatumGetTextPP(v[0]);

            problem = od::check_url(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
            if (problem)
            {
                size_t len = VARSIZE_ANY_EXHDR(t);
                char  *shown = (char *) palloc(len + 8);

                od::redact_url(VARDATA_ANY(t), len, shown, len + 8);
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("oauth_token_url %s", problem),
                         errdetail("The URL given is \"%s\".", printable(shown, strlen(shown))),
                         errhint("Only http:// and https:// URLs are supported.")));
            }
            for (int i = 1; i < 4; i++)
            {
                if (vnull[i])
                    continue;
                t = DatumGetTextPP(v[i]);
                problem = od::check_oauth_value(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t), i == 3);
                if (problem)
                    ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s %s", parts[i], problem)));
            }
            d = column(trig, tup, "headers", &isnull);
            if (!isnull && jsonb_has_key_ci(DatumGetJsonbP(d), "authorization"))
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("endpoint headers must not set Authorization when oauth_token_url is set"),
                         errdetail("The workers send the OAuth 2.0 access token as \"Authorization: Bearer\".")));
        }
    }

    /* signing_secret, and (0.3.0) the one a rotation replaced */
    static const char *const secret_columns[2] = { "signing_secret", "previous_signing_secret" };

    for (const char *colname : secret_columns)
    {
        if (SPI_fnumber(RelationGetDescr(trig->tg_relation), colname) <= 0)
            continue; /* previous_signing_secret: not in a 0.2.2 schema */
        d = column(trig, tup, colname, &isnull);
        if (!isnull)
            od_check_secret_value(d, colname);
    }

    /*
     * timeout: positive and shorter than the lease.  On UPDATE only when the
     * timeout itself changes, so that a row written under a longer lease can
     * still be disabled, renamed or re-enabled after the lease was lowered.
     */
    d = column(trig, tup, "timeout", &isnull);
    if (!isnull && TRIGGER_FIRED_BY_UPDATE(trig->tg_event))
    {
        bool  oldnull;
        Datum old = column(trig, trig->tg_trigtuple, "timeout", &oldnull);

        if (!oldnull && od_interval_us(DatumGetIntervalP(old)) == od_interval_us(DatumGetIntervalP(d)))
            isnull = true; /* unchanged: skip the checks */
    }
    if (!isnull)
    {
        int64 us = od_interval_us(DatumGetIntervalP(d));

        if (us < 1000)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("endpoint timeout must be at least 1 millisecond"),
                     errdetail("The value given is %s.", DatumGetCString(DirectFunctionCall1(interval_out, d)))));
        if (us >= (int64) od_lease_ms * 1000)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                     errmsg("endpoint timeout must be shorter than outbox_dispatcher.lease"),
                     errdetail("The timeout is %s; the lease is %d ms.",
                               DatumGetCString(DirectFunctionCall1(interval_out, d)), od_lease_ms),
                     errhint("A request that outlives its lease may be delivered twice.")));
    }

    if (ranges_in_c)
        check_ranges_before_030(trig, tup);

    if (TRIGGER_FIRED_BY_UPDATE(trig->tg_event))
    {
        int   attno = SPI_fnumber(desc, "updated_at");
        Datum now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
        bool  nnull = false;

        tup = heap_modify_tuple_by_cols(tup, desc, 1, &attno, &now, &nnull);
    }
    return PointerGetDatum(tup);
}

/* _endpoint_check() of schemas 0.1.0 to 0.2.2: the ranges are checked here */
extern "C" Datum
od_endpoint_check(PG_FUNCTION_ARGS)
{
    return endpoint_check(fcinfo, true);
}

/* _endpoint_check() of schema 0.3.0: the domains check the ranges */
extern "C" Datum
od_endpoint_check_v030(PG_FUNCTION_ARGS)
{
    return endpoint_check(fcinfo, false);
}

/*
 * endpoints_disabled (0.3.0): AFTER UPDATE OF enabled, for each row that
 * went from enabled to disabled, whoever did it (a 410 Gone, disable_after,
 * pause_endpoint(), a plain UPDATE).  Logs it and sends, at commit, a
 * NOTIFY on outbox_endpoint_disabled with a JSON payload: endpoint name and
 * reason (the first 500 bytes of each), disabled_at, disabled_by (the role).
 * Nothing secret is in it: any role of the database may LISTEN.
 */
#define OD_DISABLED_CHANNEL "outbox_endpoint_disabled"
#define OD_DISABLED_TEXT_BYTES 500 /* name and reason each: the payload stays far below NOTIFY's 8000 bytes */

extern "C" Datum
od_endpoint_disabled_trigger(PG_FUNCTION_ARGS)
{
    TriggerData   *trig = (TriggerData *) fcinfo->context;
    HeapTuple      tup;
    bool           isnull;
    Datum          d;
    char          *name;
    char          *reason = nullptr;
    int64          id = 0;
    StringInfoData buf;

    if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trig->tg_event) || !TRIGGER_FIRED_FOR_ROW(trig->tg_event) ||
        !TRIGGER_FIRED_BY_UPDATE(trig->tg_event))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"%s\" must be fired AFTER UPDATE FOR EACH ROW", "_endpoint_disabled")));
    tup = trig->tg_newtuple;
    name = TextDatumGetCString(column(trig, tup, "name", &isnull));
    d = column(trig, tup, "id", &isnull);
    if (!isnull)
        id = DatumGetInt64(d);
    d = column(trig, tup, "disabled_reason", &isnull);
    if (!isnull)
    {
        reason = TextDatumGetCString(d);
        reason[pg_mbcliplen(reason, strlen(reason), OD_DISABLED_TEXT_BYTES)] = '\0';
    }

    initStringInfo(&buf);
    appendStringInfoString(&buf, "{\"endpoint\": ");
    {
        char *clipped = pstrdup(name);

        clipped[pg_mbcliplen(clipped, strlen(clipped), OD_DISABLED_TEXT_BYTES)] = '\0';
        escape_json(&buf, clipped);
    }
    appendStringInfo(&buf, ", \"id\": " INT64_FORMAT ", \"reason\": ", id);
    if (reason)
        escape_json(&buf, reason);
    else
        appendStringInfoString(&buf, "null");
    appendStringInfoString(&buf, ", \"disabled_at\": ");
    escape_json(&buf, timestamptz_to_str(GetCurrentTimestamp()));
    appendStringInfoString(&buf, ", \"disabled_by\": ");
    escape_json(&buf, GetUserNameFromId(GetUserId(), false));
    appendStringInfoChar(&buf, '}');
    Async_Notify(OD_DISABLED_CHANNEL, buf.data);

    ereport(LOG,
            (errmsg("outbox_dispatcher: endpoint \"%s\" disabled: %s", name, reason ? reason : "no reason given"),
             errhint("Its messages wait, pending. Fix the endpoint, then run SELECT outbox.resume_endpoint(%s).",
                     quote_literal_cstr(name))));
    return PointerGetDatum(nullptr);
}

/* ---------------------------------------------------------------- subscriptions */

/* Bytes of a subscription's filter at most (its jsonb form). */
#define OD_MAX_FILTER_BYTES 8192

/*
 * outbox.subscriptions (0.3.0): event_types is a one-dimensional,
 * non-empty array of at most od::kMaxEventPatterns patterns without nulls,
 * each one accepted by od::check_event_pattern; filter is null or a JSON
 * object of at most OD_MAX_FILTER_BYTES, matched by containment against
 * the payload.
 */
extern "C" Datum
od_subscription_check(PG_FUNCTION_ARGS)
{
    TriggerData *trig = row_trigger_data(fcinfo, "_subscription_check");
    HeapTuple    tup = new_row(trig);
    bool         isnull;
    Datum        d;

    reject_nulls(trig, tup);

    d = column(trig, tup, "event_types", &isnull);
    if (!isnull)
    {
        ArrayType *arr = DatumGetArrayTypeP(d);
        Datum     *elems;
        bool      *enulls;
        int        n;

        if (ARR_NDIM(arr) == 0)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("event_types must not be empty"),
                     errhint("Use '{*}' for every event type.")));
        if (ARR_NDIM(arr) > 1)
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("event_types must be a one-dimensional array")));
        deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &enulls, &n);
        if (n > (int) od::kMaxEventPatterns)
            ereport(ERROR,
                    (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("event_types has too many patterns"),
                     errdetail("A subscription has at most %d patterns; %d were given.", (int) od::kMaxEventPatterns,
                               n)));
        for (int i = 0; i < n; i++)
        {
            text       *t;
            const char *problem;

            if (enulls[i])
                ereport(ERROR,
                        (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED), errmsg("event_types must not contain nulls"),
                         errdetail("Element %d is null.", i + 1)));
            t = DatumGetTextPP(elems[i]);
            problem = od::check_event_pattern(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
            if (problem)
                ereport(ERROR,
                        (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                         errmsg("event type pattern \"%s\" %s",
                                printable(VARDATA_ANY(t),
                                          pg_mbcliplen(VARDATA_ANY(t), (int) VARSIZE_ANY_EXHDR(t), 64)),
                                problem),
                         errdetail("It is element %d of event_types; '*' matches any run of characters.", i + 1)));
        }
    }

    d = column(trig, tup, "filter", &isnull);
    if (!isnull)
    {
        Jsonb *jb = DatumGetJsonbP(d);

        if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
            ereport(ERROR,
                    (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("filter must be a JSON object"),
                     errdetail("It is matched by containment against the payload, e.g. {\"country\": \"FR\"}.")));
        if (VARSIZE(jb) > OD_MAX_FILTER_BYTES)
            ereport(ERROR,
                    (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED), errmsg("filter is too large"),
                     errdetail("A filter has at most %d bytes.", OD_MAX_FILTER_BYTES)));
    }
    return PointerGetDatum(tup);
}
