// Unit tests for src/core/outcome.cpp: the outcome table, full-jitter
// backoff, Retry-After parsing and the error text written to last_error.
#include <gtest/gtest.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <string>

#include <curl/curl.h>

#include "core/outcome.hpp"

namespace {

using od::Outcome;
using od::Verdict;

const int kDefer[] = {409, 423};

od::OutcomePolicy policy() {
    od::OutcomePolicy p;
    p.defer_statuses = kDefer;
    p.n_defer_statuses = 2;
    p.max_attempts = 12;
    p.backoff = od::BackoffPolicy{1000, 3600 * 1000};
    p.defer_delay_ms = 30000;
    p.max_retry_after_s = 3600;
    return p;
}

od::DeliveryResult http(long status, const char *retry_after = nullptr) {
    od::DeliveryResult r;
    r.transport_error = 0;
    r.transport_message = nullptr;
    r.http_status = status;
    r.retry_after = retry_after;
    r.retry_after_len = retry_after ? std::strlen(retry_after) : 0;
    return r;
}

od::DeliveryResult transport(int code, const char *message) {
    od::DeliveryResult r = http(0);
    r.transport_error = code;
    r.transport_message = message;
    return r;
}

const int64_t kNow = 1795980427; // 2026-11-29T19:27:07Z

Outcome run(const od::DeliveryResult &r, const od::OutcomePolicy &p, int attempts, const std::string &body = "",
            uint64_t random64 = 0) {
    return od::classify(r, p, attempts, kNow, random64, body.empty() ? nullptr : body.data(), body.size());
}

Outcome run(const od::DeliveryResult &r, int attempts = 1, const std::string &body = "", uint64_t random64 = 0) {
    return run(r, policy(), attempts, body, random64);
}

bool retry_after(const std::string &v, int64_t now, int64_t *out) {
    return od::parse_retry_after(v.data(), v.size(), now, out);
}

// ------------------------------------------------------------------ 2xx

TEST(Classify, TwoHundredsAreDone) {
    for (long s : {200L, 201L, 202L, 204L, 299L}) {
        Outcome o = run(http(s), 1, "ok");
        EXPECT_EQ(o.verdict, Verdict::Done) << s;
        EXPECT_STREQ(o.error, "") << s;
        EXPECT_EQ(o.delay_ms, 0) << s;
    }
}

TEST(Classify, DoneEvenWhenAttemptsAreUsedUp) {
    EXPECT_EQ(run(http(200), 12).verdict, Verdict::Done);
    EXPECT_EQ(run(http(200), 99).verdict, Verdict::Done);
}

// ------------------------------------------------------- retryable statuses

TEST(Classify, RetryableStatusesRetry) {
    for (long s : {408L, 425L, 429L, 500L, 502L, 503L, 504L, 599L}) {
        Outcome o = run(http(s), 3, "busy");
        EXPECT_EQ(o.verdict, Verdict::Retry) << s;
        EXPECT_EQ(o.error, "HTTP " + std::to_string(s) + ": busy") << s;
    }
}

TEST(Classify, StatusIsRetryable) {
    for (long s : {408L, 425L, 429L, 500L, 501L, 503L, 550L, 599L}) EXPECT_TRUE(od::status_is_retryable(s)) << s;
    for (long s :
         {-1L, 0L, 100L, 200L, 204L, 301L, 304L, 400L, 404L, 407L, 409L, 424L, 426L, 428L, 430L, 499L, 600L, 999L})
        EXPECT_FALSE(od::status_is_retryable(s)) << s;
}

TEST(Classify, RetryDelayIsTheJitter) {
    od::OutcomePolicy p = policy();
    // attempts 3: ceiling min(1h, 1000 * 2^3) = 8000 ms
    EXPECT_EQ(run(http(503), p, 3, "", 0).delay_ms, 0);
    EXPECT_EQ(run(http(503), p, 3, "", UINT64_MAX).delay_ms, 8000);
    EXPECT_EQ(run(http(503), p, 3, "", UINT64_MAX).delay_ms, od::full_jitter_ms(3, p.backoff, UINT64_MAX));
    EXPECT_EQ(run(http(503), p, 3, "", 1ULL << 63).delay_ms, od::full_jitter_ms(3, p.backoff, 1ULL << 63));
}

TEST(Classify, RetryIsNeverSoonerThanRetryAfter) {
    // Retry-After larger than the jitter wins ...
    EXPECT_EQ(run(http(429, "120"), 1, "", UINT64_MAX).delay_ms, 120000);
    EXPECT_EQ(run(http(503, "60"), 1, "", 0).delay_ms, 60000);
    // ... a smaller one does not shorten the jitter.
    EXPECT_EQ(run(http(503, "1"), 3, "", UINT64_MAX).delay_ms, 8000);
    EXPECT_EQ(run(http(503, "0"), 3, "", UINT64_MAX).delay_ms, 8000);
    // An HTTP-date works too: 90 s from now.
    EXPECT_EQ(run(http(503, "Sun, 29 Nov 2026 19:28:37 GMT"), 1, "", 0).delay_ms, 90000);
    // A date in the past means no extra wait.
    EXPECT_EQ(run(http(503, "Sun, 06 Nov 1994 08:49:37 GMT"), 3, "", UINT64_MAX).delay_ms, 8000);
}

TEST(Classify, RetryAfterIsClampedAndGarbageIgnored) {
    EXPECT_EQ(run(http(503, "86400"), 1, "", 0).delay_ms, 3600 * 1000);
    EXPECT_EQ(run(http(503, "99999999999999999999999999"), 1, "", 0).delay_ms, 3600 * 1000);
    EXPECT_EQ(run(http(503, "-5"), 3, "", UINT64_MAX).delay_ms, 8000);
    EXPECT_EQ(run(http(503, "soon"), 3, "", UINT64_MAX).delay_ms, 8000);
    EXPECT_EQ(run(http(503, "1.5"), 3, "", UINT64_MAX).delay_ms, 8000);
    EXPECT_EQ(run(http(503, ""), 3, "", UINT64_MAX).delay_ms, 8000);

    od::OutcomePolicy p = policy();
    p.max_retry_after_s = 0; // Retry-After effectively disabled
    EXPECT_EQ(run(http(503, "600"), p, 3, "", 0).delay_ms, 0);
    p.max_retry_after_s = -1; // nonsense treated like 0
    EXPECT_EQ(run(http(503, "600"), p, 3, "", 0).delay_ms, 0);
    p.max_retry_after_s = INT64_MAX; // ms conversion saturates instead of overflowing
    EXPECT_EQ(run(http(503, "99999999999999999999"), p, 3, "", 0).delay_ms, INT64_MAX);
}

TEST(Classify, RetryAfterLengthIsHonoured) {
    od::DeliveryResult r = http(503, "120garbage");
    r.retry_after_len = 3; // not NUL-terminated at the value's end
    EXPECT_EQ(run(r, 1, "", 0).delay_ms, 120000);
}

// ------------------------------------------------------- attempts exhausted

TEST(Classify, AttemptsExhaustionBoundary) {
    Outcome o = run(http(503), 11, "busy");
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_STREQ(o.error, "HTTP 503: busy");

    o = run(http(503), 12, "busy");
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_STREQ(o.error, "HTTP 503 after 12 attempts: busy");
    EXPECT_EQ(o.delay_ms, 0);

    o = run(http(429, "30"), 13);
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_STREQ(o.error, "HTTP 429 after 13 attempts");
}

TEST(Classify, SingleAttemptPolicy) {
    od::OutcomePolicy p = policy();
    p.max_attempts = 1;
    Outcome o = run(http(500), p, 1, "oops");
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_STREQ(o.error, "HTTP 500 after 1 attempt: oops");
}

TEST(Classify, TransportErrorsExhaust) {
    Outcome o = run(transport(CURLE_OPERATION_TIMEDOUT, "Operation timed out after 10001 milliseconds"), 12);
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_STREQ(o.error, "timeout after 12 attempts: Operation timed out after 10001 milliseconds");

    o = run(transport(CURLE_OPERATION_TIMEDOUT, "Operation timed out after 10001 milliseconds"), 11);
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_STREQ(o.error, "timeout: Operation timed out after 10001 milliseconds");
}

// ---------------------------------------------------------- transport errors

TEST(Classify, TransportErrorsRetry) {
    struct {
        int code;
        const char *msg;
        const char *want;
    } cases[] = {
        {CURLE_OPERATION_TIMEDOUT, "Operation timed out", "timeout: Operation timed out"},
        {CURLE_COULDNT_RESOLVE_HOST, "Could not resolve host: nx.example",
         "DNS error: Could not resolve host: nx.example"},
        {CURLE_COULDNT_CONNECT, "Failed to connect to 127.0.0.1 port 9: Connection refused",
         "connect error: Failed to connect to 127.0.0.1 port 9: Connection refused"},
        {CURLE_PEER_FAILED_VERIFICATION, "SSL certificate problem: self-signed certificate",
         "TLS error: SSL certificate problem: self-signed certificate"},
        {CURLE_SSL_CONNECT_ERROR, "handshake failed", "TLS error: handshake failed"},
        {CURLE_RECV_ERROR, "Recv failure: Connection reset by peer",
         "connection error: Recv failure: Connection reset by peer"},
        {CURLE_SEND_ERROR, "Send failure: Broken pipe", "connection error: Send failure: Broken pipe"},
        {CURLE_GOT_NOTHING, "Empty reply from server", "empty reply: Empty reply from server"},
        {CURLE_WEIRD_SERVER_REPLY, "Unsupported HTTP version", "protocol error: Unsupported HTTP version"},
        {CURLE_URL_MALFORMAT, "bad url", "transport error (curl 3): bad url"},
    };
    for (const auto &c : cases) {
        Outcome o = run(transport(c.code, c.msg), 2, "ignored body", 0);
        EXPECT_EQ(o.verdict, Verdict::Retry) << c.code;
        EXPECT_STREQ(o.error, c.want) << c.code;
        EXPECT_EQ(o.delay_ms, 0) << c.code;
    }
}

TEST(Classify, TransportMessageMayBeNull) {
    Outcome o = run(transport(CURLE_OPERATION_TIMEDOUT, nullptr), 1);
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_EQ(std::string(o.error), std::string("timeout: ") + curl_easy_strerror(CURLE_OPERATION_TIMEDOUT));

    o = run(transport(CURLE_COULDNT_CONNECT, ""), 1);
    EXPECT_EQ(std::string(o.error), std::string("connect error: ") + curl_easy_strerror(CURLE_COULDNT_CONNECT));
}

TEST(Classify, TransportErrorWinsOverStatus) {
    // A response that broke off mid-way: curl reports an error even though a
    // status line arrived.  Delivery is not confirmed, so it is retried.
    od::DeliveryResult r = transport(CURLE_RECV_ERROR, "Recv failure");
    r.http_status = 200;
    EXPECT_EQ(run(r, 1).verdict, Verdict::Retry);
    r.http_status = 404;
    EXPECT_EQ(run(r, 1).verdict, Verdict::Retry);
    r.http_status = 409; // in the defer list, but no verdict from the endpoint
    EXPECT_EQ(run(r, 1).verdict, Verdict::Retry);
}

TEST(Classify, TransportErrorHonoursRetryAfter) {
    od::DeliveryResult r = transport(CURLE_RECV_ERROR, "Recv failure");
    r.retry_after = "45";
    r.retry_after_len = 2;
    EXPECT_EQ(run(r, 1, "", 0).delay_ms, 45000);
}

TEST(Classify, NonHttpStatusWithoutTransportErrorRetries) {
    for (long s : {0L, -1L, 99L, 600L, 1000L}) {
        Outcome o = run(http(s), 1, "", 0);
        EXPECT_EQ(o.verdict, Verdict::Retry) << s;
        EXPECT_EQ(o.error, "invalid HTTP status " + std::to_string(s)) << s;
    }
    EXPECT_EQ(run(http(0), 12).verdict, Verdict::Dead);
    EXPECT_STREQ(run(http(0), 12).error, "invalid HTTP status 0 after 12 attempts");
}

// ------------------------------------------------------- local failures

od::DeliveryResult local(int code, int os_errno, const char *message) {
    od::DeliveryResult r = transport(code, message);
    r.local_failure = true;
    r.os_errno = os_errno;
    return r;
}

TEST(Classify, LocalFailureIsARefundedRetry) {
    Outcome o = run(local(CURLE_COULDNT_CONNECT, EMFILE, "Failed to connect to 127.0.0.1 port 80"), 1, "", 0);
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_TRUE(o.local_failure);
    EXPECT_STREQ(o.error,
                 "local resource failure in the dispatcher (Too many open files); attempt not counted: "
                 "Failed to connect to 127.0.0.1 port 80");
    // the delay does not grow with attempts: [base/2, base]
    od::OutcomePolicy p = policy();
    for (int attempts : {1, 5, 11, 12, 13, 1000, INT_MAX})
        for (uint64_t r : {0ULL, 1ULL << 63, ~0ULL}) {
            Outcome l = run(local(CURLE_COULDNT_CONNECT, EMFILE, nullptr), p, attempts, "", r);
            EXPECT_EQ(l.verdict, Verdict::Retry) << attempts; // never Dead, even past max_attempts
            EXPECT_TRUE(l.local_failure);
            EXPECT_GE(l.delay_ms, 500) << attempts;
            EXPECT_LE(l.delay_ms, 1000) << attempts;
        }
    EXPECT_EQ(run(local(CURLE_COULDNT_CONNECT, EMFILE, nullptr), p, 3, "", 0).delay_ms, 500);
    EXPECT_EQ(run(local(CURLE_COULDNT_CONNECT, EMFILE, nullptr), p, 3, "", UINT64_MAX).delay_ms, 1000);
}

TEST(Classify, LocalFailureNamesTheResource) {
    EXPECT_STREQ(run(local(CURLE_COULDNT_CONNECT, ENFILE, "x"), 1).error,
                 "local resource failure in the dispatcher (Too many open files in system); attempt not counted: x");
    EXPECT_EQ(
        std::string(run(local(CURLE_SEND_ERROR, ENOBUFS, nullptr), 1).error),
        std::string("local resource failure in the dispatcher (No buffer space available); attempt not counted: ") +
            curl_easy_strerror(CURLE_SEND_ERROR));
    EXPECT_EQ(std::string(run(local(CURLE_RECV_ERROR, ENOMEM, "r"), 1).error),
              "local resource failure in the dispatcher (Cannot allocate memory); attempt not counted: r");
    EXPECT_EQ(std::string(run(local(CURLE_OUT_OF_MEMORY, 0, ""), 1).error),
              std::string("local resource failure in the dispatcher (out of memory); attempt not counted: ") +
                  curl_easy_strerror(CURLE_OUT_OF_MEMORY));
}

TEST(Classify, LocalFlagWithoutTransportErrorIsIgnored) {
    // an HTTP response is the endpoint's answer, whatever the flag says
    od::DeliveryResult r = http(200);
    r.local_failure = true;
    EXPECT_EQ(run(r, 1).verdict, Verdict::Done);
    r = http(503);
    r.local_failure = true;
    Outcome o = run(r, 12);
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_FALSE(o.local_failure);
}

TEST(Classify, OtherOutcomesAreNotLocal) {
    for (const od::DeliveryResult &r :
         {http(200), http(409), http(503), http(404), transport(CURLE_COULDNT_CONNECT, "x")})
        EXPECT_FALSE(run(r, 1).local_failure);
}

TEST(Jitter, LocalFailureDelay) {
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1000, 300000}, 0), 500);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1000, 300000}, UINT64_MAX), 1000);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1000, 400}, UINT64_MAX), 400); // cap below base
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1, 1}, 0), 0);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1, 1}, UINT64_MAX), 1);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{0, 1000}, UINT64_MAX), 0);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{1000, -1}, UINT64_MAX), 0);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{INT64_MAX, INT64_MAX}, UINT64_MAX), INT64_MAX);
    EXPECT_EQ(od::local_failure_delay_ms(od::BackoffPolicy{INT64_MAX, INT64_MAX}, 0), INT64_MAX / 2);
}

// ------------------------------------------------------- extreme settings

TEST(Classify, ExtremeSettingsDoNotOverflow) {
    // the largest values the GUCs allow: max_attempts 1000, backoff base and cap INT_MAX ms
    od::OutcomePolicy p = policy();
    p.max_attempts = 1000;
    p.backoff = od::BackoffPolicy{INT_MAX, INT_MAX};
    p.defer_delay_ms = INT_MAX;
    p.max_retry_after_s = 86400;
    EXPECT_EQ(od::full_jitter_ms(1000, p.backoff, UINT64_MAX), INT_MAX);
    EXPECT_EQ(od::full_jitter_ms(1000, p.backoff, 0), 0);
    EXPECT_EQ(od::full_jitter_ms(999, p.backoff, 1ULL << 63), INT_MAX / 2 + 1); // floor(2^63 * 2^31 / 2^64)

    Outcome o = run(http(503), p, 999, "", UINT64_MAX);
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_EQ(o.delay_ms, INT_MAX);
    o = run(http(503, "99999999999999999999"), p, 999, "", 0); // clamped to a day, not overflowed
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_EQ(o.delay_ms, 86400 * 1000);
    o = run(http(503, "99999999999999999999"), p, 999, "", UINT64_MAX);
    EXPECT_EQ(o.delay_ms, INT_MAX); // the jitter is longer than the clamped Retry-After
    o = run(http(503, "99999999999999999999"), p, 1000, "", UINT64_MAX);
    EXPECT_EQ(o.verdict, Verdict::Dead);
    EXPECT_STREQ(o.error, "HTTP 503 after 1000 attempts");
    o = run(http(409, "99999999999999999999"), p, 1000);
    EXPECT_EQ(o.verdict, Verdict::Defer);
    EXPECT_EQ(o.delay_ms, 86400 * 1000);
    o = run(http(409), p, 1000);
    EXPECT_EQ(o.delay_ms, INT_MAX);
    o = run(local(CURLE_COULDNT_CONNECT, EMFILE, nullptr), p, 1000, "", UINT64_MAX);
    EXPECT_EQ(o.verdict, Verdict::Retry);
    EXPECT_EQ(o.delay_ms, INT_MAX);

    p.max_retry_after_s = INT64_MAX; // even unclamped: saturates instead of wrapping
    o = run(http(503, "99999999999999999999"), p, 999, "", UINT64_MAX);
    EXPECT_EQ(o.delay_ms, INT64_MAX);
    o = run(http(429, "99999999999999999999"), p, 1, "", 0);
    EXPECT_EQ(o.delay_ms, INT64_MAX);
}

// ------------------------------------------------------------------- defer

TEST(Classify, DeferListDefers) {
    Outcome o = run(http(409), 3, "not yet");
    EXPECT_EQ(o.verdict, Verdict::Defer);
    EXPECT_EQ(o.delay_ms, 30000);
    EXPECT_STREQ(o.error, "deferred: HTTP 409: not yet");

    o = run(http(423));
    EXPECT_EQ(o.verdict, Verdict::Defer);
    EXPECT_STREQ(o.error, "deferred: HTTP 423");
}

TEST(Classify, DeferUsesRetryAfter) {
    EXPECT_EQ(run(http(409, "120")).delay_ms, 120000);
    EXPECT_EQ(run(http(409, "0")).delay_ms, 0);
    EXPECT_EQ(run(http(409, "Sun, 29 Nov 2026 19:28:37 GMT")).delay_ms, 90000);
    EXPECT_EQ(run(http(409, "Sun, 06 Nov 1994 08:49:37 GMT")).delay_ms, 0); // past: now
    EXPECT_EQ(run(http(409, "86400")).delay_ms, 3600 * 1000);               // clamped
    EXPECT_EQ(run(http(409, "bogus")).delay_ms, 30000);                     // defer_delay
    EXPECT_EQ(run(http(409, "-3")).delay_ms, 30000);
}

TEST(Classify, DeferRefundsTheAttempt) {
    // Never Dead for running out of attempts: the attempt does not count.
    EXPECT_EQ(run(http(409), 12).verdict, Verdict::Defer);
    EXPECT_EQ(run(http(409), 1000).verdict, Verdict::Defer);
    EXPECT_STREQ(run(http(409), 1000).error, "deferred: HTTP 409");
}

TEST(Classify, DeferListWinsOverOtherRules) {
    const int list[] = {503, 404, 302, 200};
    od::OutcomePolicy p = policy();
    p.defer_statuses = list;
    p.n_defer_statuses = 4;
    EXPECT_EQ(run(http(503), p, 12).verdict, Verdict::Defer); // retryable + exhausted
    EXPECT_EQ(run(http(404), p, 1).verdict, Verdict::Defer);  // otherwise Dead
    EXPECT_EQ(run(http(302), p, 1).verdict, Verdict::Defer);
    EXPECT_EQ(run(http(502), p, 1).verdict, Verdict::Retry); // not listed
    EXPECT_EQ(run(http(200), p, 1).verdict, Verdict::Done);  // 2xx is always delivered
}

TEST(Classify, NegativeDeferDelayIsZero) {
    od::OutcomePolicy p = policy();
    p.defer_delay_ms = -10;
    EXPECT_EQ(run(http(409), p, 1).delay_ms, 0);
}

TEST(Classify, EmptyDeferList) {
    od::OutcomePolicy p = policy();
    p.defer_statuses = nullptr;
    p.n_defer_statuses = 0;
    EXPECT_EQ(run(http(409), p, 1).verdict, Verdict::Dead);
}

// -------------------------------------------------------------------- dead

TEST(Classify, OtherStatusesAreDead) {
    for (long s : {100L, 101L, 199L, 300L, 301L, 302L, 303L, 304L, 307L, 308L, 400L, 401L,
                   403L, 404L, 405L, 407L, 410L, 413L, 422L, 424L, 426L, 451L, 499L}) {
        Outcome o = run(http(s, "5"), 1, "nope");
        EXPECT_EQ(o.verdict, Verdict::Dead) << s;
        EXPECT_EQ(o.delay_ms, 0) << s;
        EXPECT_EQ(o.error, "HTTP " + std::to_string(s) + ": nope") << s;
    }
}

TEST(Classify, DeadWithoutBody) {
    EXPECT_STREQ(run(http(404), 1).error, "HTTP 404");
    Outcome o = od::classify(http(404), policy(), 1, kNow, 0, nullptr, 0);
    EXPECT_STREQ(o.error, "HTTP 404");
    o = od::classify(http(404), policy(), 1, kNow, 0, nullptr, 25); // nullptr wins over a length
    EXPECT_STREQ(o.error, "HTTP 404");
}

// ------------------------------------------------------- body in the error

TEST(ErrorText, ControlCharactersBecomeSingleSpaces) {
    std::string body("{\r\n  \"error\":\t\"bad\"\r\n}\n");
    EXPECT_STREQ(run(http(400), 1, body).error, "HTTP 400: { \"error\": \"bad\" }");
    std::string nul(
        "a\0b\x7f"
        "c\x1b[31md",
        11);
    EXPECT_STREQ(run(http(400), 1, nul).error, "HTTP 400: a b c [31md");
}

TEST(ErrorText, WhitespaceOnlyBodyIsOmitted) {
    EXPECT_STREQ(run(http(400), 1, " \r\n\t ").error, "HTTP 400");
    EXPECT_STREQ(run(http(400), 1, std::string("\0\0", 2)).error, "HTTP 400");
}

TEST(ErrorText, Utf8IsKeptInvalidBytesAreReplaced) {
    EXPECT_STREQ(run(http(400), 1, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80").error,
                 "HTTP 400: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    // Latin-1, a stray continuation byte, an overlong '/', a surrogate, a truncated sequence.
    EXPECT_STREQ(run(http(400), 1, "caf\xe9 \x80 \xc0\xaf \xed\xa0\x80 \xe2\x82").error, "HTTP 400: caf? ? ?? ??? ??");
}

TEST(ErrorText, LongBodyIsTruncatedWithMarker) {
    Outcome o = run(http(400), 1, std::string(10000, 'a'));
    EXPECT_EQ(std::string(o.error), "HTTP 400: " + std::string(300, 'a') + "...");

    o = run(http(400), 1, std::string(300, 'b')); // exactly the limit: nothing left out
    EXPECT_EQ(std::string(o.error), "HTTP 400: " + std::string(300, 'b'));

    o = run(http(400), 1, std::string(300, 'b') + "  \r\n"); // only trailing whitespace left out
    EXPECT_EQ(std::string(o.error), "HTTP 400: " + std::string(300, 'b'));

    o = run(http(400), 1, std::string(301, 'c'));
    EXPECT_EQ(std::string(o.error), "HTTP 400: " + std::string(300, 'c') + "...");
}

TEST(ErrorText, TruncationNeverSplitsACharacter) {
    std::string e;
    for (int i = 0; i < 400; i++) e += "\xc3\xa9";
    std::string pre;
    for (int i = 0; i < 149; i++) pre += "\xc3\xa9";
    Outcome o = run(http(400), 1, "x" + e); // "x" + 149 * 2 bytes = 299 bytes; the next would be 301
    EXPECT_EQ(std::string(o.error), "HTTP 400: x" + pre + "...");
}

TEST(ErrorText, LongCurlMessageIsTruncated) {
    std::string m(2000, 'm');
    Outcome o = run(transport(CURLE_OPERATION_TIMEDOUT, m.c_str()), 12);
    EXPECT_EQ(std::string(o.error), "timeout after 12 attempts: " + std::string(300, 'm') + "...");
}

TEST(ErrorText, AlwaysFitsAndIsTerminated) {
    std::string body(100000, 'z');
    std::string m(100000, 'q');
    const od::DeliveryResult results[] = {
        http(200), http(301), http(404), http(409), http(503), http(0), transport(CURLE_URL_MALFORMAT, m.c_str())};
    for (const auto &r : results)
        for (int attempts : {1, 12, INT_MAX}) {
            Outcome o = run(r, attempts, body);
            std::size_t n = strnlen(o.error, sizeof o.error);
            EXPECT_LT(n, od::kOutcomeErrorSize);
            EXPECT_LE(n, 400u);
        }
    Outcome o = run(http(409), INT_MAX, body);
    EXPECT_EQ(std::string(o.error), "deferred: HTTP 409: " + std::string(300, 'z') + "...");
    o = run(http(503), INT_MAX, body);
    EXPECT_EQ(std::string(o.error), "HTTP 503 after 2147483647 attempts: " + std::string(300, 'z') + "...");
}

// ------------------------------------------------------------------ jitter

TEST(Jitter, BoundsComeFromRandomExtremes) {
    od::BackoffPolicy b{100, 10000};
    EXPECT_EQ(od::full_jitter_ms(0, b, 0), 0);
    EXPECT_EQ(od::full_jitter_ms(0, b, UINT64_MAX), 100);
    EXPECT_EQ(od::full_jitter_ms(1, b, UINT64_MAX), 200);
    EXPECT_EQ(od::full_jitter_ms(3, b, UINT64_MAX), 800);
    EXPECT_EQ(od::full_jitter_ms(6, b, UINT64_MAX), 6400);
    EXPECT_EQ(od::full_jitter_ms(7, b, UINT64_MAX), 10000); // 12800 capped
    EXPECT_EQ(od::full_jitter_ms(7, b, 0), 0);
}

TEST(Jitter, MidpointAndMonotonic) {
    od::BackoffPolicy b{100, 10000};
    EXPECT_EQ(od::full_jitter_ms(0, b, 1ULL << 63), 50); // floor(2^63 * 101 / 2^64)
    int64_t prev = -1;
    for (uint64_t r = 0; r < 64; r++) {
        int64_t j = od::full_jitter_ms(4, b, r << 58);
        EXPECT_GE(j, prev);
        EXPECT_GE(j, 0);
        EXPECT_LE(j, 1600);
        prev = j;
    }
}

TEST(Jitter, EveryValueInRangeIsReachable) {
    od::BackoffPolicy b{1, 1000};
    // ceiling 8: 9 equal buckets of random64, each mapping to one delay.
    bool seen[9] = {};
    for (uint64_t i = 0; i < 9; i++) {
        uint64_t r = (UINT64_MAX / 9) * i + UINT64_MAX / 18; // middle of bucket i
        int64_t j = od::full_jitter_ms(3, b, r);
        ASSERT_GE(j, 0);
        ASSERT_LE(j, 8);
        seen[j] = true;
    }
    for (bool s : seen) EXPECT_TRUE(s);
}

TEST(Jitter, HugeAttemptsSaturateToTheCap) {
    od::BackoffPolicy b{100, 3600000};
    for (int a : {25, 62, 63, 64, 100, 1000, INT_MAX}) {
        EXPECT_EQ(od::full_jitter_ms(a, b, UINT64_MAX), 3600000) << a;
        EXPECT_EQ(od::full_jitter_ms(a, b, 0), 0) << a;
    }
    od::BackoffPolicy huge{1, INT64_MAX};
    EXPECT_EQ(od::full_jitter_ms(62, huge, UINT64_MAX), INT64_C(1) << 62);
    EXPECT_EQ(od::full_jitter_ms(63, huge, UINT64_MAX), INT64_MAX);
    EXPECT_EQ(od::full_jitter_ms(INT_MAX, huge, UINT64_MAX), INT64_MAX);
    od::BackoffPolicy big_base{INT64_MAX / 2 + 1, INT64_MAX};
    EXPECT_EQ(od::full_jitter_ms(1, big_base, UINT64_MAX), INT64_MAX);
}

TEST(Jitter, DegeneratePolicies) {
    EXPECT_EQ(od::full_jitter_ms(3, od::BackoffPolicy{0, 1000}, UINT64_MAX), 0);
    EXPECT_EQ(od::full_jitter_ms(3, od::BackoffPolicy{1000, 0}, UINT64_MAX), 0);
    EXPECT_EQ(od::full_jitter_ms(3, od::BackoffPolicy{-5, 1000}, UINT64_MAX), 0);
    EXPECT_EQ(od::full_jitter_ms(-4, od::BackoffPolicy{100, 1000}, UINT64_MAX), 100);  // as attempts 0
    EXPECT_EQ(od::full_jitter_ms(0, od::BackoffPolicy{5000, 1000}, UINT64_MAX), 1000); // cap below base
}

// ------------------------------------------------------------- Retry-After

TEST(RetryAfter, DelaySeconds) {
    int64_t d = -1;
    EXPECT_TRUE(retry_after("120", kNow, &d));
    EXPECT_EQ(d, 120);
    EXPECT_TRUE(retry_after("0", kNow, &d));
    EXPECT_EQ(d, 0);
    EXPECT_TRUE(retry_after("007", kNow, &d));
    EXPECT_EQ(d, 7);
    EXPECT_TRUE(retry_after("  30\t ", kNow, &d));
    EXPECT_EQ(d, 30);
}

TEST(RetryAfter, HugeSecondsSaturate) {
    int64_t d = 0;
    EXPECT_TRUE(retry_after("9223372036854775807", kNow, &d));
    EXPECT_EQ(d, INT64_MAX);
    EXPECT_TRUE(retry_after("9223372036854775808", kNow, &d));
    EXPECT_EQ(d, INT64_MAX);
    EXPECT_TRUE(retry_after(std::string(500, '9'), kNow, &d));
    EXPECT_EQ(d, INT64_MAX);
    EXPECT_TRUE(retry_after("9223372036854775806", kNow, &d));
    EXPECT_EQ(d, INT64_MAX - 1);
}

TEST(RetryAfter, RejectsNegativeFractionalAndGarbage) {
    int64_t d = 77;
    for (const char *v : {"", " ", "\t", "-1", "-0", "+5", "1.5", "1,5", "1e3", "12abc", "abc", "0x10", "1 2", "5s",
                          "\xef\xbc\x95", "Sun", "now"}) {
        EXPECT_FALSE(retry_after(v, kNow, &d)) << v;
        EXPECT_EQ(d, 77) << v; // untouched on failure
    }
    EXPECT_FALSE(od::parse_retry_after(nullptr, 0, kNow, &d));
    EXPECT_FALSE(od::parse_retry_after("12", 0, kNow, &d)); // empty by length
    EXPECT_FALSE(retry_after(std::string("1\0", 2), kNow, &d));
}

TEST(RetryAfter, HttpDatesAllThreeForms) {
    const int64_t t = 784111777; // 1994-11-06T08:49:37Z
    int64_t d = -1;
    EXPECT_TRUE(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", t - 60, &d));
    EXPECT_EQ(d, 60);
    EXPECT_TRUE(retry_after("Sunday, 06-Nov-94 08:49:37 GMT", t - 61, &d));
    EXPECT_EQ(d, 61);
    EXPECT_TRUE(retry_after("Sun Nov  6 08:49:37 1994", t - 62, &d));
    EXPECT_EQ(d, 62);
    EXPECT_TRUE(retry_after("Sun Nov 06 08:49:37 1994", t - 63, &d));
    EXPECT_EQ(d, 63);
    EXPECT_TRUE(retry_after("  Sun, 06 Nov 1994 08:49:37 GMT  ", t - 1, &d));
    EXPECT_EQ(d, 1);
    EXPECT_TRUE(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", t, &d));
    EXPECT_EQ(d, 0);
}

TEST(RetryAfter, PastDatesGiveZero) {
    int64_t d = -1;
    EXPECT_TRUE(retry_after("Sun, 06 Nov 1994 08:49:37 GMT", kNow, &d));
    EXPECT_EQ(d, 0);
    d = -1;
    EXPECT_TRUE(retry_after("Sun Nov  6 08:49:37 1994", kNow, &d));
    EXPECT_EQ(d, 0);
    d = -1;
    EXPECT_TRUE(retry_after("Thu, 01 Jan 1970 00:00:00 GMT", INT64_MAX, &d));
    EXPECT_EQ(d, 0);
}

TEST(RetryAfter, FutureDateFarAwayDoesNotOverflow) {
    int64_t d = -1;
    EXPECT_TRUE(retry_after("Fri, 31 Dec 9999 23:59:59 GMT", INT64_MIN, &d));
    EXPECT_EQ(d, INT64_MAX);
    EXPECT_TRUE(retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 0, &d));
    EXPECT_EQ(d, INT64_C(253402300799));
}

TEST(RetryAfter, DateArithmetic) {
    int64_t d = -1;
    EXPECT_TRUE(retry_after("Sat, 01 Jan 2000 00:00:00 GMT", 0, &d));
    EXPECT_EQ(d, 946684800);
    EXPECT_TRUE(retry_after("Thu, 29 Feb 2024 12:00:00 GMT", 0, &d));
    EXPECT_EQ(d, 1709208000);
    EXPECT_TRUE(retry_after("Tue, 29 Feb 2000 00:00:00 GMT", 0, &d)); // 2000 is a leap year
    EXPECT_EQ(d, 951782400);
    // Before 1970: Apollo 11 landing, 1969-07-20T20:17:40Z = -14182940.
    EXPECT_TRUE(retry_after("Sun, 20 Jul 1969 20:17:40 GMT", -14182950, &d));
    EXPECT_EQ(d, 10);
    EXPECT_TRUE(retry_after("Wed, 31 Dec 2025 23:59:60 GMT", 0, &d)); // leap second tolerated
    EXPECT_EQ(d, 1767225600);
}

TEST(RetryAfter, ImfFixdateRoundTrip) {
    // Every 7 days + 13h 1m 7s from 1901 to 2100, formatted by strftime in the C locale.
    for (int64_t t = -2145916800; t < INT64_C(4102444800); t += 7 * 86400 + 13 * 3600 + 67) {
        std::time_t tt = static_cast<std::time_t>(t);
        std::tm tm;
        ASSERT_NE(gmtime_r(&tt, &tm), nullptr);
        char buf[64];
        std::size_t n = std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        int64_t d = -1;
        ASSERT_TRUE(od::parse_retry_after(buf, n, t - 5, &d)) << buf;
        ASSERT_EQ(d, 5) << buf;
    }
}

TEST(RetryAfter, Rfc850TwoDigitYears) {
    const int64_t y2026 = 1767225600; // 2026-01-01T00:00:00Z
    int64_t d = -1;
    // 2076 is 50 years ahead: taken as 2076.
    EXPECT_TRUE(retry_after("Wednesday, 01-Jan-76 00:00:00 GMT", y2026, &d));
    EXPECT_EQ(d, INT64_C(3345062400) - y2026);
    // 2077 would be more than 50 years ahead: it is 1977, in the past.
    EXPECT_TRUE(retry_after("Saturday, 01-Jan-77 00:00:00 GMT", y2026, &d));
    EXPECT_EQ(d, 0);
    EXPECT_TRUE(retry_after("Sunday, 06-Nov-94 08:49:37 GMT", y2026, &d));
    EXPECT_EQ(d, 0);
    // 26 -> 2026
    EXPECT_TRUE(retry_after("Thursday, 01-Jan-26 00:01:00 GMT", y2026, &d));
    EXPECT_EQ(d, 60);
}

TEST(RetryAfter, RejectsMalformedDates) {
    int64_t d = 77;
    for (const char *v : {
             "Sun, 31 Feb 1994 08:49:37 GMT", // no such day
             "Mon, 29 Feb 1900 08:49:37 GMT", // 1900 is not a leap year
             "Wed, 29 Feb 2023 08:49:37 GMT", // nor is 2023
             "Sun, 00 Nov 1994 08:49:37 GMT",   "Sun, 06 Nov 1994 24:00:00 GMT",    "Sun, 06 Nov 1994 08:60:37 GMT",
             "Sun, 06 Nov 1994 08:49:61 GMT",   "Sun, 06 Nov 1994 08:49:37 UTC",    "Sun, 06 Nov 1994 08:49:37",
             "Sun, 06 Nov 1994 08:49:37 GMT x", "Sun, 6 Nov 1994 08:49:37 GMT",     "Sun, 06 Nov 94 08:49:37 GMT",
             "Sun, 06 Abc 1994 08:49:37 GMT",   "Fun, 06 Nov 1994 08:49:37 GMT",    "Sun 06 Nov 1994 08:49:37 GMT",
             "Sun,  06 Nov 1994 08:49:37 GMT",  "Sun, 06 Nov 1994 8:49:37 GMT",     "Sunday, 06-Nov-1994 08:49:37 GMT",
             "Sun, 06-Nov-94 08:49:37 GMT",     "Sunday, 06 Nov 1994 08:49:37 GMT", "Sun Nov 6 08:49:37 1994",
             "Sun Nov  6 08:49:37 94",          "Sun Nov  6 08:49:37 1994 GMT",     "1994-11-06T08:49:37Z",
         }) {
        EXPECT_FALSE(retry_after(v, 0, &d)) << v;
        EXPECT_EQ(d, 77) << v;
    }
}

TEST(RetryAfter, NamesAreCaseInsensitive) {
    int64_t d = -1;
    EXPECT_TRUE(retry_after("sun, 06 NOV 1994 08:49:37 gmt", 784111777 - 3, &d));
    EXPECT_EQ(d, 3);
}

} // namespace

TEST(Verdict, NamesAreWhatTheFinalizeStatementReads) {
    // the finalize maps these names to statuses (transitions.cpp SQL_FINALIZE)
    EXPECT_STREQ(od::verdict_name(od::Verdict::Done), "done");
    EXPECT_STREQ(od::verdict_name(od::Verdict::Retry), "retry");
    EXPECT_STREQ(od::verdict_name(od::Verdict::Defer), "defer");
    EXPECT_STREQ(od::verdict_name(od::Verdict::Dead), "dead");
}

namespace {

TEST(Jitter, RetryScheduleEntryPerAttemptWithin10Percent) {
    const int64_t sched[] = {5000, 300000, 1800000};
    od::BackoffPolicy b{1000, 300000};
    b.schedule_ms = sched;
    b.n_schedule = 3;
    // attempt n failed: entry n (1-based), the last one repeats; 0 or less: the first
    EXPECT_EQ(od::full_jitter_ms(1, b, 0), 4500);
    EXPECT_EQ(od::full_jitter_ms(1, b, UINT64_MAX), 5500);
    EXPECT_EQ(od::full_jitter_ms(2, b, 0), 270000);
    EXPECT_EQ(od::full_jitter_ms(2, b, UINT64_MAX), 330000);
    EXPECT_EQ(od::full_jitter_ms(3, b, 0), 1620000);
    EXPECT_EQ(od::full_jitter_ms(9, b, UINT64_MAX), 1980000);
    EXPECT_EQ(od::full_jitter_ms(0, b, 0), 4500);
    EXPECT_EQ(od::full_jitter_ms(-5, b, UINT64_MAX), 5500);
    // the middle of the random range is the entry itself
    EXPECT_EQ(od::full_jitter_ms(1, b, 1ULL << 63), 5000);
    // every value within +-10 %: a spread of random inputs
    for (uint64_t r = 1; r != 0 && r < (1ULL << 63); r *= 3) {
        int64_t d = od::full_jitter_ms(2, b, r);
        EXPECT_GE(d, 270000);
        EXPECT_LE(d, 330000);
    }
    // the longest allowed entry (7 days) does not overflow
    const int64_t week[] = {7LL * 86400 * 1000};
    b.schedule_ms = week;
    b.n_schedule = 1;
    EXPECT_EQ(od::full_jitter_ms(1000, b, UINT64_MAX), 7LL * 86400 * 1100);
}

} // namespace
