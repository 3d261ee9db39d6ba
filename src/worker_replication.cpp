/*
 * worker_replication.cpp — outbox_dispatcher.deliver_after_replication: the
 * PostgreSQL side of core/replication_gate.hpp.  After a claim commits, the
 * worker flushes its commit record (the walsenders send only flushed WAL;
 * the workers' own commits are asynchronous) and holds the claimed messages
 * until the synchronous standbys — those synchronous_standby_names names,
 * the same set synchronous_commit waits for — have flushed up to it.
 * Requests already in flight go on meanwhile; nothing here blocks, so
 * SIGTERM and a reload are served as always.  See worker.h.
 */
#include "worker.h"
#include "core/replication_gate.hpp"

extern "C" {
#include "access/xlog.h"
#include "replication/syncrep.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
}

namespace odw {

/* LSN_FORMAT_ARGS, which C++ cannot compile (its type assertion is C only) */
#define OD_LSN_ARGS(lsn) (uint32)((uint64) (lsn) >> 32), (uint32) (lsn)

/* while a claim waits, look at the standbys' position this often; after a stall, this often */
static const int AWAIT_POLL_MS = 1;
static const int STALL_POLL_MS = 100;

/* The mode is on and names at least one synchronous standby. */
static bool
gate_applies(void)
{
    return od_deliver_after_replication && SyncRepStandbyNames != nullptr && SyncRepStandbyNames[0] != '\0';
}

/* The WAL position the synchronous standbys have confirmed flushing (what synchronous_commit = on waits for). */
static XLogRecPtr
confirmed_flush(void)
{
    XLogRecPtr lsn;

    if (WalSndCtl == nullptr)
        return InvalidXLogRecPtr;
    LWLockAcquire(SyncRepLock, LW_SHARED);
    lsn = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH];
    LWLockRelease(SyncRepLock);
    return lsn;
}

/* What outbox._replication_wait() and worker_stats show. */
static void
publish(void)
{
    bool waiting = od::gate_waiting(W.gate);

    if (waiting && W.replication_wait_began == 0)
        W.replication_wait_began = GetCurrentTimestamp();
    else if (!waiting)
        W.replication_wait_began = 0;
    pg_atomic_write_u64(&W.slot->replication_wait_since, (uint64) W.replication_wait_began);
    pg_atomic_write_u32(&W.slot->replication_held, waiting ? (uint32) W.disp->queued() : 0);
}

void
replication_check_settings(void)
{
    if (od_deliver_after_replication && !gate_applies() && W.worker_index == 0)
        ereport(WARNING,
                (errmsg("outbox_dispatcher.deliver_after_replication has no effect: synchronous_standby_names is "
                        "empty"),
                 errhint("Name the synchronous standbys that must have a message's commit before it is sent.")));
    if (!gate_applies() && od::gate_waiting(W.gate))
    {
        od::gate_clear(W.gate);
        ereport(LOG,
                (errmsg("outbox_dispatcher worker %d: no longer waiting for synchronous standbys", W.worker_index)));
    }
    publish();
}

void
replication_claimed(XLogRecPtr commit_end)
{
    if (!gate_applies() || XLogRecPtrIsInvalid(commit_end))
        return;
    XLogFlush(commit_end);
    od::gate_claimed(W.gate, (uint64) commit_end, (int64) GetCurrentTimestamp());
    publish();
}

bool
replication_may_send(TimestampTz now)
{
    XLogRecPtr   confirmed;
    bool         was_stalled;
    uint64       waited_for;
    int64        hold_us = od::replication_hold_limit_us((int64) od_lease_ms * 1000);
    od::GateStep step;

    if (!od::gate_waiting(W.gate))
        return true;
    if (!gate_applies())
    {
        replication_check_settings();
        return true;
    }
    confirmed = confirmed_flush();
    was_stalled = W.gate.stalled_lsn != 0;
    waited_for = W.gate.awaiting_lsn;
    step = od::gate_step(W.gate, (uint64) confirmed, (int64) now, hold_us);
    if (step == od::GateStep::Release)
    {
        size_t n = W.disp->queued();

        W.disp->release_queued("not sent: the synchronous standbys did not confirm the claim in time "
                               "(outbox_dispatcher.deliver_after_replication); released");
        ereport(LOG,
                (errmsg("outbox_dispatcher worker %d: the synchronous standbys have not confirmed WAL position %X/%X "
                        "in %lld ms; released %zu message(s), no claims until they do",
                        W.worker_index, OD_LSN_ARGS(waited_for), (long long) (hold_us / 1000), n),
                 errdetail("outbox_dispatcher.deliver_after_replication is on; confirmed so far: %X/%X.",
                           OD_LSN_ARGS(confirmed))));
    }
    else if (was_stalled && W.gate.stalled_lsn == 0)
        ereport(LOG,
                (errmsg("outbox_dispatcher worker %d: the synchronous standbys confirmed WAL position %X/%X; "
                        "claiming again",
                        W.worker_index, OD_LSN_ARGS(confirmed))));
    publish();
    return step == od::GateStep::Send;
}

bool
replication_claims_held(void)
{
    if (!od::gate_waiting(W.gate) || !gate_applies())
        return false;
    return !od::gate_may_claim(W.gate, (uint64) confirmed_flush());
}

TimestampTz
replication_poll_at(TimestampTz now)
{
    if (!od::gate_waiting(W.gate) || !gate_applies())
        return 0;
    return TimestampTzPlusMilliseconds(now, W.gate.awaiting_lsn != 0 ? AWAIT_POLL_MS : STALL_POLL_MS);
}

bool
replication_waiting(void)
{
    return od::gate_waiting(W.gate);
}

} // namespace odw
