/*
 * wake.cpp — wake the dispatcher workers when messages are committed, and
 * tell them when the endpoints changed (endpoints_generation, 0.3.0).
 *
 * A statement-level AFTER INSERT trigger on outbox.messages (and wake(),
 * and the operator functions that make messages ready) only raise a
 * backend-local flag.  A transaction callback, registered once per backend,
 * wakes the workers (od_wake_workers) when a transaction with the flag
 * commits and clears the flag when it aborts: an aborted transaction wakes
 * nobody, and any number of inserts in one transaction cost one wake.
 *
 * Locking: none.  Latch pointers live in the worker slots in shared memory;
 * SetLatch on a slot whose worker just exited is harmless (a spurious wake
 * of whatever process now owns that PGPROC latch).
 */
#include "outbox_dispatcher.h"
#include "wake.h"
#include "module.h"

extern "C" {
#include "access/xact.h"
#include "commands/trigger.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(od_wake_sql);
PG_FUNCTION_INFO_V1(od_wake_trigger);
PG_FUNCTION_INFO_V1(od_endpoints_changed_trigger);
}

static bool wake_pending = false;
static bool endpoints_changed_pending = false;
static bool callback_registered = false;

/*
 * Wake the lowest-numbered idle worker other than `skip` (-1: none):
 * clear its idle flag and set its latch.  False if no worker is idle.
 * Lowest first rather than round-robin, so that a worker holding results
 * is the one whose claim finalizes them (do_claim) and light load does not
 * spread over every worker by rotation.
 */
static bool
wake_lowest_idle(int skip)
{
    int n = Min(od_workers, OD_MAX_WORKERS);

    for (int k = 0; k < n; k++)
    {
        OdWorkerSlot *w = &od_shared->workers[k];
        Latch        *latch = w->latch;
        uint32        expected = 1;

        if (k != skip && w->pid != 0 && latch != nullptr && pg_atomic_compare_exchange_u32(&w->idle, &expected, 0))
        {
            SetLatch(latch);
            return true;
        }
    }
    return false;
}

/* Set every running worker's latch. */
static void
wake_all_workers(void)
{
    int n = Min(od_workers, OD_MAX_WORKERS);

    for (int i = 0; i < n; i++)
    {
        OdWorkerSlot *w = &od_shared->workers[i];
        Latch        *latch = w->latch;

        if (w->pid != 0 && latch != nullptr)
            SetLatch(latch);
    }
}

/*
 * Wake one idle worker if there is one: it claims what was committed, and
 * the others stay asleep instead of racing it for the same rows.  When no
 * worker is idle, every worker's latch is set: busy workers then claim again
 * as soon as their pipeline has room, so no commit waits for poll_interval.
 * A worker raises its idle flag only right before it sleeps with nothing in
 * flight, and the latch is level-triggered, so no wake is lost.
 */
void
od_wake_workers(void)
{
    int n;

    if (od_shared == nullptr)
        return;
    n = Min(od_workers, OD_MAX_WORKERS);
    if (n <= 0 || wake_lowest_idle(-1))
        return;
    wake_all_workers();
}

/*
 * A worker whose claim came back full (there may be more): wake an idle
 * worker other than itself, which does the same if its claim is full too.
 * A burst committed at once thus spreads over the workers within a few
 * claims instead of waiting for their next poll (test/tap/058_burst.pl),
 * and a trickle that one claim keeps up with wakes nobody.
 */
void
od_wake_idle_peer(int self)
{
    if (od_shared != nullptr)
        (void) wake_lowest_idle(self);
}

static void
od_xact_callback(XactEvent event, void *arg)
{
    switch (event)
    {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
            /* after ProcArrayEndTransaction: a worker that sees the new generation sees the change */
            if (endpoints_changed_pending && od_shared != nullptr)
            {
                pg_atomic_fetch_add_u64(&od_shared->endpoints_generation, 1);
                wake_all_workers();
            }
            endpoints_changed_pending = false;
            if (wake_pending)
            {
                wake_pending = false;
                od_wake_workers();
            }
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
        case XACT_EVENT_PREPARE:
            /* a prepared transaction commits elsewhere; the poll picks it up */
            wake_pending = false;
            endpoints_changed_pending = false;
            break;
        default:
            break;
    }
}

static void
register_callback(void)
{
    if (!callback_registered)
    {
        RegisterXactCallback(od_xact_callback, nullptr);
        callback_registered = true;
    }
}

void
od_wake_at_commit(void)
{
    register_callback();
    wake_pending = true;
}

void
od_endpoints_changed_at_commit(void)
{
    register_callback();
    endpoints_changed_pending = true;
}

extern "C" Datum
od_wake_sql(PG_FUNCTION_ARGS)
{
    od_wake_at_commit();
    PG_RETURN_VOID();
}

extern "C" Datum
od_wake_trigger(PG_FUNCTION_ARGS)
{
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"_wake_trigger\" must be called as a trigger")));
    od_wake_at_commit();
    return PointerGetDatum(nullptr);
}

/*
 * AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ... FOR EACH STATEMENT on
 * outbox.endpoints (0.3.0): the workers reload their endpoints when the
 * change commits.  A change in a subtransaction that is rolled back still
 * counts (one needless reload); a prepared transaction's change is seen by
 * the workers' safety poll.
 */
extern "C" Datum
od_endpoints_changed_trigger(PG_FUNCTION_ARGS)
{
    if (!CALLED_AS_TRIGGER(fcinfo))
        ereport(ERROR,
                (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                 errmsg("function \"_endpoints_changed\" must be called as a trigger")));
    od_endpoints_changed_at_commit();
    return PointerGetDatum(nullptr);
}
