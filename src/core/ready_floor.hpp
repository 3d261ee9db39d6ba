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
 * So each worker remembers, per endpoint, a floor: a position (available_at,
 * id) in that index, the claim reading only entries at or after it.  After a
 * claim the floor is the first row it took (in index order), but never later
 * than the claim's own start less a lag (kReadyFloorLagUs), and that start
 * less the lag when it took none.  So in a backlog older than the lag the
 * claim starts at the first row the last one took — also among the
 * messages of one transaction, which share their available_at (a drain of
 * one INSERT of 100,000 read 167 pages per scan when the floor was an
 * available_at alone; the claims' scans were 12 % of the workers' CPU, perf);
 * near the present it starts a lag behind.  A message that becomes
 * claimable below the floor — its producer's transaction ran longer than
 * the lag (available_at defaults to its start), it was given an
 * available_at in the past, an operator moved it to another endpoint,
 * another worker's claim of it rolled back, or it is ordered and waited for
 * older transactions to end — waits for the claim that reads from the
 * first entry again, every kReadyFullScanUs.
 * An ordered message whose predecessor became done may be below it too (it
 * waited for the predecessor): a worker that finalizes an ordered message
 * as done has every worker read from the first entry at its next claim
 * (the caller's part).
 *
 * Pure C++ so that the rule is unit-tested; times are microseconds on the
 * database's clock.
 */
#pragma once

#include <cstdint>

namespace od {

/* A position in messages_ready: (available_at, id), compared in that order. */
struct ReadyKey {
    int64_t at_us;
    int64_t id;
};

/* "read from the first entry": also PostgreSQL's -infinity timestamptz and the least bigint */
constexpr int64_t kReadFromFirst = INT64_MIN;
constexpr ReadyKey kFirstKey{ kReadFromFirst, INT64_MIN };
/* how far the floor stays behind a claim's start (see above) */
constexpr int64_t kReadyFloorLagUs = 1000 * 1000;
/* the longest time between two claims of an endpoint that read from the first entry */
constexpr int64_t kReadyFullScanUs = 1000 * 1000;

inline bool ready_key_less(const ReadyKey &a, const ReadyKey &b) noexcept {
    return a.at_us < b.at_us || (a.at_us == b.at_us && a.id < b.id);
}

inline bool ready_key_is_first(const ReadyKey &k) noexcept {
    return k.at_us == kFirstKey.at_us && k.id == kFirstKey.id;
}

/* One endpoint's floor in one worker; all zero = nothing known yet (read from the first entry). */
struct ReadyFloor {
    bool known;           /* floor is set */
    ReadyKey floor;       /* read entries at or after this */
    int64_t full_scan_us; /* when the last claim that read from the first entry started */
};

/*
 * Where a claim starting at now_us reads the endpoint from: the floor, or
 * kFirstKey when none is known, or kReadyFullScanUs have passed since the
 * last claim that read from the first entry (or the clock went back).
 */
ReadyKey ready_scan_from(const ReadyFloor &f, int64_t now_us) noexcept;

/*
 * After the claim committed: it started at now_us (the worker's clock) and
 * in a transaction started at claim_start_us (the database's now()), read
 * from scanned_from (what ready_scan_from returned) and claimed `claimed`
 * messages of the endpoint, the first of which in index order is
 * first_claimed.
 */
void ready_floor_claimed(ReadyFloor &f, int64_t now_us, const ReadyKey &scanned_from, int64_t claim_start_us,
                         int claimed, const ReadyKey &first_claimed) noexcept;

/* Forget the floor: the next claim reads from the first entry. */
inline void ready_floor_reset(ReadyFloor &f) noexcept {
    f.known = false;
}

} // namespace od
