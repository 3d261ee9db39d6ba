/*
 * outbox_dispatcher.h — the base of every PostgreSQL-facing file: postgres.h
 * inside extern "C", the library's version, the conventions below.  Each
 * module declares its own interface in its own header (module.h, guard.h,
 * transitions.h, wake.h, endpoint_state.h, catalog.h, worker.h), which
 * includes this one.
 *
 * Files under src/core/ are pure C++ and must not include it.
 *
 * Conventions for every file that includes it:
 *   - code between SPI_connect and SPI_finish, or anything that may
 *     ereport(ERROR), keeps no C++ object with a destructor on its stack;
 *     an ERROR is a longjmp and would skip destructors;
 *   - calls into src/core/ are noexcept by contract (they return error
 *     strings), so no C++ exception can cross a PostgreSQL frame.
 */
#ifndef OUTBOX_DISPATCHER_H
#define OUTBOX_DISPATCHER_H

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
}

/* The library's version: the newest schema it serves, and the User-Agent. */
#define OD_LIBRARY_VERSION "0.3.0"

#endif /* OUTBOX_DISPATCHER_H */
