/*
 * pg_compat.h — every difference between the PostgreSQL majors this
 * extension supports (15, 17, 18), in one place.  No other file tests
 * PG_VERSION_NUM.
 */
#ifndef OUTBOX_PG_COMPAT_H
#define OUTBOX_PG_COMPAT_H

extern "C" {
#include "postgres.h"
#include "executor/executor.h"
#include "storage/latch.h"
#include "utils/memutils.h"
}

/*
 * A WaitEventSet owned by nobody but the caller (the worker keeps its one
 * set for the life of the process).  PostgreSQL 17 made the first argument a ResourceOwner
 * (NULL: not tracked); before, it was the memory context to allocate in.
 */
static inline WaitEventSet *
od_create_wait_event_set(int nevents)
{
#if PG_VERSION_NUM >= 170000
    return CreateWaitEventSet(NULL, nevents);
#else
    return CreateWaitEventSet(TopMemoryContext, nevents);
#endif
}

/*
 * The index entries of a row just inserted (no unique check deferred, no
 * ON CONFLICT).  PostgreSQL 16 added the last argument (only the
 * summarizing indexes, after a HOT update).
 */
static inline void
od_insert_index_tuples(ResultRelInfo *rri, TupleTableSlot *slot, EState *estate)
{
#if PG_VERSION_NUM >= 160000
    (void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL, false);
#else
    (void) ExecInsertIndexTuples(rri, slot, estate, false, false, NULL, NIL);
#endif
}

#endif /* OUTBOX_PG_COMPAT_H */
