/*
 * core/schedule.cpp — the worker's schedule (see schedule.hpp).
 */
#include "core/schedule.hpp"

#include <climits>

namespace od {

namespace {

int half_pipeline(const WorkerCycle &c) noexcept {
    int half = c.pipeline / 2;
    return half < 1 ? 1 : half;
}

bool backing_off(const WorkerCycle &c) noexcept {
    return c.now < c.backoff_until;
}

int64_t least(int64_t a, int64_t b) noexcept {
    return a < b ? a : b;
}

int64_t greatest(int64_t a, int64_t b) noexcept {
    return a > b ? a : b;
}

/* A claim can come (now or at a deadline): claiming is on, not held for the standbys, and there is room. */
bool claim_can_come(const WorkerCycle &c) noexcept {
    return c.active && !c.claims_held && has_claim_room(c);
}

/*
 * Results are never held for a spaced claim longer than this after the
 * oldest of them: waiting longer saves little, and a lease can be as short
 * as 100 ms.
 */
const int64_t kMaxFinalizeHoldUs = 20000;

/*
 * When a wake may claim: at once after a full claim, else claim_spacing_us
 * after the last claim.  A last claim further ahead than the spacing can
 * only come from a clock that was set back: ignored, so that it does not
 * hold commits back until the clock catches up.
 */
int64_t wake_claim_at(const WorkerCycle &c) noexcept {
    if (c.last_claim_full || c.last_claim == 0 || c.claim_spacing_us <= 0) return 0;
    if (c.last_claim - c.now > c.claim_spacing_us) return 0;
    return c.last_claim + c.claim_spacing_us;
}

/*
 * When the waiting results are due for a transaction of their own:
 * flush_after_us after the oldest, or, if a wake's claim is pending and
 * comes within claim_spacing_us (at most kMaxFinalizeHoldUs) of the
 * oldest, at that claim (which finalizes them in its own transaction).
 */
int64_t finalize_due(const WorkerCycle &c) noexcept {
    int64_t due = c.oldest_result + c.flush_after_us;
    if (c.woken && claim_can_come(c)) {
        int64_t claim_at = wake_claim_at(c);
        if (claim_at > due && claim_at <= c.oldest_result + least(c.claim_spacing_us, kMaxFinalizeHoldUs))
            due = claim_at;
    }
    return due;
}

} // namespace

int endpoint_share(int max_in_flight, int workers) noexcept {
    if (max_in_flight <= 0) return INT_MAX;
    if (workers < 1) workers = 1;
    int share = max_in_flight / workers + (max_in_flight % workers != 0 ? 1 : 0);
    return share < 1 ? 1 : share;
}

int pipeline_size(int64_t shares, int batch_size) noexcept {
    return (shares > 0 && shares < batch_size) ? (int) shares : batch_size;
}

bool has_claim_room(const WorkerCycle &c) noexcept {
    return c.pipeline - c.held >= half_pipeline(c);
}

int claim_now(const WorkerCycle &c) noexcept {
    if (!claim_can_come(c) || backing_off(c)) return 0;
    bool reason = (c.woken && c.now >= wake_claim_at(c)) || c.last_claim_full || c.now >= c.next_poll ||
                  (c.next_quota != 0 && c.now >= c.next_quota) || (c.places_released && c.claim_quota_full);
    return reason ? c.pipeline - c.held : 0;
}

bool finalize_now(const WorkerCycle &c) noexcept {
    if (c.results <= 0 || backing_off(c)) return false;
    return c.results >= half_pipeline(c) || (c.in_flight == 0 && !c.active) ||
           c.now >= finalize_due(c);
}

bool refresh_now(const WorkerCycle &c) noexcept {
    return !backing_off(c) && (c.now >= c.next_refresh || c.endpoints_changed || (c.woken && !c.installed));
}

int64_t refresh_period_us(bool changes_announced, int64_t poll_interval_us) noexcept {
    if (!changes_announced) return poll_interval_us;
    return poll_interval_us > kEndpointSafetyPollUs ? poll_interval_us : kEndpointSafetyPollUs;
}

bool purge_now(const WorkerCycle &c) noexcept {
    return c.purges && !backing_off(c) && c.now >= c.next_purge;
}

int64_t next_wakeup(const WorkerCycle &c) noexcept {
    bool can_claim = claim_can_come(c);
    int64_t until = c.endpoints_changed ? c.now : c.next_refresh;

    if (can_claim) until = least(until, c.last_claim_full ? c.now : c.next_poll);
    if (can_claim && c.woken) until = least(until, greatest(c.now, wake_claim_at(c)));
    if (can_claim && c.next_quota != 0) until = least(until, c.next_quota);
    if (c.results > 0) until = least(until, finalize_due(c));
    if (c.purges) until = least(until, c.next_purge);
    if (c.replication_poll != 0) until = least(until, c.replication_poll);
    if (backing_off(c) && until < c.backoff_until) until = c.backoff_until;
    return until;
}

long wait_ms(int64_t now, int64_t until) noexcept {
    const int64_t cap = 0x7fffffffL;
    if (until <= now) return 0;
    if (now >= 0 ? until - now > cap * 1000 : until > now + cap * 1000) return static_cast<long>(cap);
    return static_cast<long>((until - now + 999) / 1000);
}

} // namespace od
