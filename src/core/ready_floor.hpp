/*
 * ready_floor.hpp — where a worker's claim starts reading an endpoint's
 * ready messages.
 *
 * A claim reads messages_ready (endpoint, available_at, id) WHERE status =
 * 'pending' from the endpoint's oldest entry.  A claim leaves the old row
 * version's entry there; only a VACUUM (autovacuum: once a minute at best)
 * or an insert into the same leaf page removes it.  At a steady rate the
 * inserts do (the index stays a few pages), but the head of a draining
 * backlog gets no inserts, so every claim stepped over the entries of all
 * the messages claimed before it: after 290,000 deliveries without a
 * VACUUM, 1,436 index pages and 8 ms per claim of 100 rows instead of 7
 * pages and 0.2 ms.
 *
 * So each worker remembers, per endpoint, a floor: the claim reads only
 * entries with available_at >= floor.  After a claim the floor is the
 * oldest available_at it claimed, or the claim's own start when it found
 * nothing, less a lag (kReadyFloorLagUs).  A message that becomes ready
 * with an older available_at — its producer's transaction ran longer than
 * the lag (available_at defaults to its start), it was given an
 * available_at in the past, an operator moved it to another endpoint, or a
 * claim of it rolled back — is below the floor: every kReadyFullScanUs the
 * claim reads from the first entry again, so it waits at most that much
 * longer.  An ordered message whose predecessor became done may be below
 * it too (it waited for the predecessor): a worker that finalizes an
 * ordered message as done has every worker read from the first entry at
 * its next claim (the caller's part).
 *
 * Pure C++ so that the rule is unit-tested; times are microseconds on the
 * database's clock.
 */
#pragma once

#include <cstdint>

namespace od {

/* "read from the first entry": also PostgreSQL's -infinity timestamptz */
constexpr int64_t kReadFromFirst = INT64_MIN;
/* how far the floor stays behind what was claimed (see above) */
constexpr int64_t kReadyFloorLagUs = 1000 * 1000;
/* the longest time between two claims of an endpoint that read from the first entry */
constexpr int64_t kReadyFullScanUs = 1000 * 1000;

/* One endpoint's floor in one worker; all zero = nothing known yet (read from the first entry). */
struct ReadyFloor {
    bool known;           /* floor_us is set */
    int64_t floor_us;     /* read entries with available_at >= this */
    int64_t full_scan_us; /* when the last claim that read from the first entry started */
};

/*
 * Where a claim starting at now_us reads the endpoint from: the floor, or
 * kReadFromFirst when none is known, or kReadyFullScanUs have passed since
 * the last claim that read from the first entry (or the clock went back).
 */
int64_t ready_scan_from(const ReadyFloor &f, int64_t now_us) noexcept;

/*
 * After the claim committed: it started at now_us (the worker's clock) and
 * in a transaction started at claim_start_us (the database's now()), read
 * from scanned_from (what ready_scan_from returned) and claimed `claimed`
 * messages of the endpoint, the oldest available_at of which is
 * min_available_us.
 */
void ready_floor_claimed(ReadyFloor &f, int64_t now_us, int64_t scanned_from, int64_t claim_start_us, int claimed,
                         int64_t min_available_us) noexcept;

/* Forget the floor: the next claim reads from the first entry. */
inline void ready_floor_reset(ReadyFloor &f) noexcept {
    f.known = false;
}

} // namespace od
