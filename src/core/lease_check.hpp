/*
 * lease_check.hpp — when must expired leases be looked for?
 *
 * A lease can expire only at its deadline.  The workers therefore do not
 * scan for expired leases on every claim: shared memory holds the time of
 * the next check, every claim lowers it to the earliest deadline it just
 * set, and each check sets it to the earliest deadline still outstanding.
 * Pure C++ so that the rule is unit-tested; times are microseconds on one
 * clock (the database's).
 */
#pragma once

#include <cstdint>

namespace od {

struct LeaseCheckPolicy {
    /* expired leases left in place (e.g. of an endpoint whose breaker is
     * open, which are not taken over) are looked at again this often */
    int64_t min_gap_us = 100 * 1000;
    /* the longest time between two checks while leases are outstanding:
     * bounds how late a lease is noticed whose claim committed while a
     * check was reading the deadlines, and one restored or written by hand */
    int64_t max_gap_us = 5 * 1000 * 1000;
};

/*
 * The next check after one at `now` that found the earliest outstanding
 * deadline `earliest` (has_earliest false: no lease is outstanding), and
 * reaped exactly its limit of exhausted leases (more may be waiting).
 */
int64_t next_lease_check(int64_t now, bool has_earliest, int64_t earliest, bool reap_full,
                         const LeaseCheckPolicy &p = LeaseCheckPolicy()) noexcept;

/* The check time after a claim that set a lease with deadline `deadline`. */
inline int64_t lower_lease_check(int64_t current, int64_t deadline) noexcept {
    return deadline < current ? deadline : current;
}

} // namespace od
