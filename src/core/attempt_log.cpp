/*
 * core/attempt_log.cpp — the ring of attempt-log partitions (see attempt_log.hpp).
 */
#include "core/attempt_log.hpp"

namespace od {

int64_t
attempt_day(int64_t unix_us) noexcept
{
    const int64_t us_per_day = INT64_C(86400000000);
    int64_t       d = unix_us / us_per_day;

    if (unix_us % us_per_day < 0)
        d--;
    return d;
}

/*
 * The attempt_stats view (sql/outbox_dispatcher--0.3.0.sql) computes the same
 * bucket in SQL (mod(floor(epoch / 86400), 32)): change both or neither.
 */
int
attempt_bucket(int64_t day) noexcept
{
    int64_t b = day % kAttemptBuckets;

    return (int) (b < 0 ? b + kAttemptBuckets : b);
}

bool
attempt_bucket_kept(int bucket, int64_t today, int retention_days) noexcept
{
    if (retention_days < 0)
        retention_days = 0;
    if (retention_days > kMaxAttemptRetentionDays)
        retention_days = kMaxAttemptRetentionDays;
    for (int back = 0; back <= retention_days; back++)
        if (attempt_bucket(today - back) == bucket)
            return true;
    return false;
}

} // namespace od
