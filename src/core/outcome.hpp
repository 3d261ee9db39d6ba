/*
 * core/outcome.hpp — what one delivery attempt means for its message.
 *
 * Pure C++ (no PostgreSQL headers), noexcept and allocation-free, so the
 * worker can call it from PostgreSQL frames.  Implements the outcome table
 * of the design (docs/reference.md §10, "Outcome of a delivery"):
 *
 *   2xx                                  -> Done
 *   status in the endpoint's defer list  -> Defer, delay = Retry-After or defer_delay,
 *                                           attempt refunded (max_defer_age is applied
 *                                           by the database, which owns the clock)
 *   408, 425, 429, 5xx, transport error  -> Retry after full-jitter backoff
 *   (connect/DNS/TLS/timeout/reset)         random(0, min(cap, base * 2^attempts)),
 *                                           never sooner than Retry-After;
 *                                           Dead once attempts >= max_attempts
 *   other 1xx/3xx/4xx                    -> Dead
 *   local resource failure (this process -> Retry after local_failure_delay_ms,
 *   out of descriptors or memory)           attempt refunded, never Dead
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace od {

/* What the finalize does with a message (the one list of verdicts). */
enum class Verdict { Done, Retry, Defer, Dead };

/* The name the finalize statement receives: "done", "retry", "defer", "dead". */
const char *verdict_name(Verdict v) noexcept;

struct BackoffPolicy {
    int64_t base_ms;
    int64_t cap_ms;
    /*
     * An endpoint's retry_schedule: the delay before retry n (after attempt
     * n failed) is schedule_ms[min(n, n_schedule) - 1], jittered uniformly
     * within +-10 %; n_schedule 0 = exponential backoff from base/cap.
     */
    const int64_t *schedule_ms = nullptr;
    std::size_t n_schedule = 0;
};

/* What happened on the wire for one request. */
struct DeliveryResult {
    int transport_error;           /* 0: an HTTP response was received; else a CURLcode */
    const char *transport_message; /* curl's message for transport errors, or nullptr */
    long http_status;              /* 0 when no response */
    const char *retry_after;       /* raw Retry-After header value, or nullptr */
    std::size_t retry_after_len;
    /*
     * The transport error was this process's own (HttpCompletion::local_failure):
     * the endpoint is not to blame and the attempt does not count.  Ignored
     * without a transport error (an HTTP response is the endpoint's answer).
     */
    bool local_failure = false;
    int os_errno = 0; /* the errno behind it, 0 if unknown */
};

/* Per-endpoint and global settings that classification depends on. */
struct OutcomePolicy {
    const int *defer_statuses;
    std::size_t n_defer_statuses;
    int max_attempts;
    BackoffPolicy backoff;
    int64_t defer_delay_ms;
    int64_t max_retry_after_s; /* Retry-After values are clamped to this */
};

constexpr std::size_t kOutcomeErrorSize = 512;

struct Outcome {
    Verdict verdict;
    int64_t delay_ms;              /* Retry/Defer: delay before the message is available again */
    bool local_failure;            /* Retry for a local failure: refund the attempt, not the endpoint's doing */
    char error[kOutcomeErrorSize]; /* "" for Done; otherwise why (for last_error) */
};

/*
 * Classify one result.  attempts is the message's attempt count including
 * this one (as returned by claim).  now_unix_s is the current time, used
 * only to turn a Retry-After HTTP-date into a delay.  random64 is a uniformly
 * random 64-bit value (the caller owns the random source, so tests are
 * deterministic).  body/body_len: a prefix of the response body (may be
 * nullptr), quoted in error for non-2xx responses (truncated to fit).
 */
Outcome classify(const DeliveryResult &r, const OutcomePolicy &p, int attempts, int64_t now_unix_s, uint64_t random64,
                 const char *body, std::size_t body_len) noexcept;

/*
 * The delay after attempt `attempts` failed: with a schedule, its entry for
 * that attempt (the last one repeats) times a uniform factor in [0.9, 1.1];
 * otherwise random(0, min(cap, base * 2^attempts)) in ms, overflow-safe for
 * any attempts >= 0.
 */
int64_t full_jitter_ms(int attempts, const BackoffPolicy &b, uint64_t random64) noexcept;

/*
 * Delay after a local resource failure: uniform in [c/2, c] with
 * c = min(base, cap), whatever the attempt count (the attempt is refunded,
 * so there is no growth; never 0, so a worker out of descriptors does not
 * spin on the same messages).
 */
int64_t local_failure_delay_ms(const BackoffPolicy &b, uint64_t random64) noexcept;

/*
 * Parse a Retry-After value: delay-seconds (non-negative integer) or an
 * HTTP-date (IMF-fixdate, plus the obsolete RFC 850 and asctime forms).
 * Sets *delay_s (a date in the past gives 0) and returns true; returns false
 * for anything else (negative numbers, garbage, empty).  Huge values are
 * saturated, never overflowed.
 */
bool parse_retry_after(const char *v, std::size_t len, int64_t now_unix_s, int64_t *delay_s) noexcept;

/* Is this status retryable per the table (408, 425, 429, 5xx)? */
bool status_is_retryable(long status) noexcept;

/*
 * The attempt log's class of a transport error (a CURLcode): "timeout",
 * "dns", "connect", "tls", "connection" (send/receive failed, reset),
 * "protocol" (empty or malformed reply) or "other"; nullptr for 0 (an HTTP
 * response was received).
 */
const char *transport_error_class(int curl_code) noexcept;

/*
 * text as it may be stored or logged, the way last_error quotes a response
 * body: leading whitespace dropped, runs of whitespace and control
 * characters as one space, invalid UTF-8 as '?', cut (marked "...") to fit
 * outsz - 1 bytes without splitting a character.  NUL-terminated; returns
 * the length written.
 */
std::size_t sanitize_text(const char *text, std::size_t len, char *out, std::size_t outsz) noexcept;

} // namespace od
