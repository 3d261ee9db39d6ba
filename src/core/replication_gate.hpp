/*
 * core/replication_gate.hpp — outbox_dispatcher.deliver_after_replication:
 * when may a worker send what it claimed, and when may it claim again?
 *
 * A message visible to a claim committed before the claim's snapshot, so
 * its commit record lies before the claim's own commit record.  Once the
 * synchronous standbys have flushed WAL up to the claim's commit, every
 * message of that claim — and the lease on it — survives a failover to any
 * of them.  The worker therefore records its claim's commit position and
 * sends nothing queued until the standbys' confirmed flush position reaches
 * it; requests already in flight go on.  One claim waits at a time.
 *
 * If the standbys do not confirm within the hold limit, the worker gives
 * the queued messages back (released, attempt refunded: no lease runs out
 * and no attempt is charged while a standby is away) and claims again only
 * once the standbys have confirmed the position it gave up at — an isolated
 * primary fences itself, at the cost of one claim per outage.
 *
 * Positions are WAL positions (XLogRecPtr); 0 means none.  Times are
 * microseconds on the database's clock.
 */
#pragma once

#include <cstdint>

namespace od {

struct ReplicationGate {
    uint64_t awaiting_lsn = 0;  /* a claim's commit, not yet confirmed; 0 = none */
    int64_t awaiting_since = 0; /* when that claim committed */
    uint64_t stalled_lsn = 0;   /* a wait given up at this position; 0 = none */
};

enum class GateStep {
    Send,    /* nothing waits (any more): send what is queued */
    Hold,    /* keep the queued messages until the standbys confirm */
    Release, /* waited longer than the hold limit: give the queued messages back */
};

/* How long queued messages may wait for the standbys: a quarter of the
 * lease, at most 5 s, at least 10 ms (the request still needs its timeout
 * inside the lease afterwards). */
int64_t replication_hold_limit_us(int64_t lease_us) noexcept;

/* A claim committed at `lsn` (`now`): its messages wait for confirmation. */
void gate_claimed(ReplicationGate &g, uint64_t lsn, int64_t now) noexcept;

/*
 * Where the gate stands with the standbys' confirmed flush position
 * `confirmed`, and the state after: a confirmation clears the wait (and a
 * stall it passes); a wait past the hold limit becomes a stall.
 */
GateStep gate_step(ReplicationGate &g, uint64_t confirmed, int64_t now, int64_t hold_limit_us) noexcept;

/* Whether a new claim may be made: no claim waits, and no stall the
 * standbys have not passed. */
bool gate_may_claim(const ReplicationGate &g, uint64_t confirmed) noexcept;

/* Whether the worker waits on the standbys (the view's state, the poll). */
inline bool gate_waiting(const ReplicationGate &g) noexcept {
    return g.awaiting_lsn != 0 || g.stalled_lsn != 0;
}

/* The mode is off, or no synchronous standby is named: nothing waits. */
inline void gate_clear(ReplicationGate &g) noexcept {
    g = ReplicationGate();
}

} // namespace od
