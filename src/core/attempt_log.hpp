/*
 * core/attempt_log.hpp — where outbox.attempts keeps a row, and when a
 * part of it can be emptied whole.
 *
 * Pure C++ (no PostgreSQL headers), noexcept.  outbox.attempts is a ring of
 * kAttemptBuckets list partitions, one per UTC day modulo kAttemptBuckets
 * (attempts_00 .. attempts_31), created with the extension: the workers
 * never run DDL, and expiring a day is a TRUNCATE of its partition (no
 * dead rows, no vacuum) instead of a DELETE.  With a retention of R days
 * the partitions of today and the R days before it are kept; every other
 * one holds only days older than that (or is empty) and is emptied, so
 * R <= kAttemptBuckets - 2 leaves at least tomorrow's partition free to be
 * emptied before tomorrow starts.  Rows are kept between R and R + 1 days.
 */
#pragma once

#include <cstdint>

namespace od {

constexpr int kAttemptBuckets = 32;
/* Longest retention, in days: tomorrow's partition must be free. */
constexpr int kMaxAttemptRetentionDays = kAttemptBuckets - 2;

/* The UTC day number of a Unix time in microseconds (floor division). */
int64_t attempt_day(int64_t unix_us) noexcept;

/* The partition of a day: day modulo kAttemptBuckets, in 0..kAttemptBuckets-1. */
int attempt_bucket(int64_t day) noexcept;

/*
 * Does the partition hold a day that is still kept (today and the
 * retention_days before it)?  retention_days is clamped to
 * 0..kMaxAttemptRetentionDays.
 */
bool attempt_bucket_kept(int bucket, int64_t today, int retention_days) noexcept;

} // namespace od
