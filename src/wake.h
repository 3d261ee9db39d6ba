/*
 * wake.h — declarations of wake.cpp: waking the workers at commit.
 */
#ifndef OUTBOX_DISPATCHER_WAKE_H
#define OUTBOX_DISPATCHER_WAKE_H

#include "outbox_dispatcher.h"

/* Wake the workers when the current transaction commits. */
extern void od_wake_at_commit(void);
/* At commit: bump endpoints_generation and set every worker's latch (the endpoints changed). */
extern void od_endpoints_changed_at_commit(void);
/* Wake the workers now. */
extern void od_wake_workers(void);
/* Wake one idle worker other than worker `self` (its claim came back full). */
extern void od_wake_idle_peer(int self);

#endif /* OUTBOX_DISPATCHER_WAKE_H */
