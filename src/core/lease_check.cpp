/*
 * lease_check.cpp — see lease_check.hpp.
 */
#include "core/lease_check.hpp"

namespace od {

static int64_t sat_add(int64_t a, int64_t b) noexcept {
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

int64_t next_lease_check(int64_t now, bool has_earliest, int64_t earliest, bool reap_full,
                         const LeaseCheckPolicy &p) noexcept {
    if (reap_full) return now;
    int64_t lo = sat_add(now, p.min_gap_us < 0 ? 0 : p.min_gap_us);
    int64_t hi = sat_add(now, p.max_gap_us < 0 ? 0 : p.max_gap_us);
    if (hi < lo) hi = lo;
    if (!has_earliest) return hi;
    if (earliest < lo) return lo;
    if (earliest > hi) return hi;
    return earliest;
}

} // namespace od
