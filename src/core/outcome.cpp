/*
 * core/outcome.cpp — classify one delivery attempt (see outcome.hpp).
 *
 * Everything here is arithmetic on the caller's inputs: no clock, no random
 * source, no allocation, no exceptions.  The caller passes the time and a
 * random 64-bit value, so every decision is reproducible in the unit tests.
 *
 * Decisions the header leaves open, made here:
 *
 *  - Order of the rules: an HTTP response with a 2xx status is Done; a
 *    transport error (transport_error != 0) is retryable whatever
 *    http_status says; then the endpoint's defer list; then the retryable
 *    statuses (408, 425, 429, 5xx); anything else is Dead.  The defer list
 *    therefore wins over the retry rule (503 listed there is a Defer), but
 *    never over 2xx (the endpoint trigger restricts the list to 300-599
 *    anyway).  A response with no transport error but a status outside
 *    100-599 is not HTTP; it is treated like a transport error (Retry).
 *
 *  - Full jitter is inclusive: the delay is uniform in [0, ceiling] where
 *    ceiling = min(cap, base * 2^attempts), computed with a saturating
 *    shift so that any attempts (up to INT_MAX) is safe.  random64 is mapped
 *    onto [0, ceiling] by the high half of the 128-bit product
 *    random64 * (ceiling + 1), so random64 = 0 gives 0 and random64 =
 *    UINT64_MAX gives exactly ceiling, without modulo bias worth mentioning.
 *
 *  - Retry-After is honoured for every Retry and Defer verdict when it is
 *    present and parses, clamped to [0, max_retry_after_s] seconds.  A Retry
 *    waits max(jitter, Retry-After); a Defer waits Retry-After, else
 *    defer_delay_ms.  A Defer refunds the attempt, so it never turns Dead
 *    here (max_defer_age is the database's business).
 *
 *  - A local failure (DeliveryResult::local_failure with a transport error)
 *    is tested before everything else: Retry, attempt refunded
 *    (Outcome::local_failure), local_failure_delay_ms, whatever attempts
 *    and max_attempts say, Retry-After ignored (no response).  The error
 *    names the resource from the errno with our own short table (strerror
 *    is neither guaranteed allocation-free nor thread-safe) and quotes
 *    curl's message after it.
 *
 *  - error is a short English sentence for last_error.  Quoted response
 *    bodies and curl messages are made safe for a text column: control
 *    characters (CR, LF, TAB, NUL, DEL, ...) become spaces, runs of
 *    whitespace collapse to one space, leading/trailing whitespace goes,
 *    well-formed UTF-8 is kept, and every other byte >= 0x80 becomes '?'.
 *    At most kMaxQuotedBody bytes of a body are quoted, cut on a character
 *    boundary, with "..." appended when something was left out.
 */
#include "core/outcome.hpp"

#include "core/ascii.hpp"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include <curl/curl.h>

namespace od {
namespace {

/* Longest body prefix quoted in an error message, in bytes. */
constexpr std::size_t kMaxQuotedBody = 300;
/* Longest curl message quoted in an error message, in bytes. */
constexpr std::size_t kMaxQuotedMessage = 300;

/* ---------------------------------------------------------------- arithmetic */

int64_t sat_mul(int64_t a, int64_t b) noexcept {
    /* both non-negative */
    if (a == 0 || b == 0) return 0;
    if (a > INT64_MAX / b) return INT64_MAX;
    return a * b;
}

int64_t sat_sub(int64_t a, int64_t b) noexcept {
    if (b < 0 && a > INT64_MAX + b) return INT64_MAX;
    if (b > 0 && a < INT64_MIN + b) return INT64_MIN;
    return a - b;
}

/* High 64 bits of the 128-bit product a * b, portably. */
uint64_t mul_hi64(uint64_t a, uint64_t b) noexcept {
    uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32;
    uint64_t b_lo = b & 0xffffffffu, b_hi = b >> 32;
    uint64_t lo_lo = a_lo * b_lo;
    uint64_t hi_lo = a_hi * b_lo;
    uint64_t lo_hi = a_lo * b_hi;
    uint64_t hi_hi = a_hi * b_hi;
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
    return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

/* ------------------------------------------------------------ error writer */

struct Writer {
    char *buf;
    std::size_t cap; /* including the NUL */
    std::size_t len;

    std::size_t room() const noexcept { return len + 1 < cap ? cap - 1 - len : 0; }

    void put(const char *s, std::size_t n) noexcept {
        if (n > room()) n = room();
        std::memcpy(buf + len, s, n);
        len += n;
        buf[len] = '\0';
    }
    void put(const char *s) noexcept { put(s, std::strlen(s)); }
    void put_long(long v) noexcept {
        char tmp[32];
        int n = std::snprintf(tmp, sizeof tmp, "%ld", v);
        if (n > 0) put(tmp, static_cast<std::size_t>(n));
    }
};

/* Length of the well-formed UTF-8 sequence at p (RFC 3629), or 0. */
std::size_t utf8_sequence(const unsigned char *p, std::size_t n) noexcept {
    unsigned char c = p[0];
    std::size_t need;
    unsigned char lo = 0x80, hi = 0xbf; /* range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c == 0xe0) {
        need = 3;
        lo = 0xa0;
    } else if (c == 0xed) {
        need = 3;
        hi = 0x9f;
    } /* no surrogates */
    else if (c >= 0xe1 && c <= 0xef)
        need = 3;
    else if (c == 0xf0) {
        need = 4;
        lo = 0x90;
    } else if (c >= 0xf1 && c <= 0xf3)
        need = 4;
    else if (c == 0xf4) {
        need = 4;
        hi = 0x8f;
    } /* <= U+10FFFF */
    else
        return 0;
    if (n < need) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (std::size_t i = 2; i < need; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return need;
}

inline bool is_space_or_control(unsigned char c) noexcept {
    return c < 0x20 || c == 0x7f || c == ' ';
}

/*
 * Append ": <sanitized text>" (nothing at all when the text is empty once
 * sanitized), quoting at most max bytes of output text and adding "..." when
 * input was left out.
 */
void put_quoted(Writer &w, const char *text, std::size_t len, std::size_t max) noexcept {
    if (text == nullptr) return;
    const unsigned char *p = reinterpret_cast<const unsigned char *>(text);
    std::size_t i = 0;
    while (i < len && is_space_or_control(p[i])) i++; /* trim leading */
    if (i == len) return;

    w.put(": ");
    /* Keep room for "..." so that truncation can always be marked. */
    std::size_t budget = w.room() >= 3 ? w.room() - 3 : 0;
    if (budget > max) budget = max;
    std::size_t written = 0;
    bool pending_space = false;
    bool truncated = false;
    while (i < len) {
        unsigned char c = p[i];
        if (is_space_or_control(c)) {
            pending_space = true;
            i++;
            continue;
        }
        std::size_t seq = 1;
        char repl = static_cast<char>(c);
        if (c >= 0x80) {
            seq = utf8_sequence(p + i, len - i);
            if (seq == 0) {
                seq = 1;
                repl = '?';
            }
        }
        std::size_t out = seq + (pending_space ? 1 : 0);
        if (written + out > budget) {
            truncated = true;
            break;
        }
        if (pending_space) w.put(" ", 1);
        if (seq == 1)
            w.put(&repl, 1);
        else
            w.put(text + i, seq);
        written += out;
        pending_space = false;
        i += seq;
    }
    if (truncated) w.put("...");
}

const char *transport_kind(int code) noexcept {
    switch (code) {
        case CURLE_OPERATION_TIMEDOUT:
            return "timeout";
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            return "DNS error";
        case CURLE_COULDNT_CONNECT:
            return "connect error";
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CERTPROBLEM:
        case CURLE_SSL_CIPHER:
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_SSL_SHUTDOWN_FAILED:
        case CURLE_SSL_CRL_BADFILE:
        case CURLE_SSL_ISSUER_ERROR:
        case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
        case CURLE_SSL_INVALIDCERTSTATUS:
            return "TLS error";
        case CURLE_SEND_ERROR:
        case CURLE_RECV_ERROR:
            return "connection error";
        case CURLE_GOT_NOTHING:
            return "empty reply";
        case CURLE_WEIRD_SERVER_REPLY:
            return "protocol error";
        default:
            return nullptr;
    }
}

/* "timeout", "HTTP 503", "transport error (curl 3)", "invalid HTTP status 0" */
void put_what(Writer &w, const DeliveryResult &r, bool not_http) noexcept {
    if (r.transport_error != 0) {
        const char *kind = transport_kind(r.transport_error);
        if (kind != nullptr) {
            w.put(kind);
        } else {
            w.put("transport error (curl ");
            w.put_long(r.transport_error);
            w.put(")");
        }
    } else if (not_http) {
        w.put("invalid HTTP status ");
        w.put_long(r.http_status);
    } else {
        w.put("HTTP ");
        w.put_long(r.http_status);
    }
}

/* The curl message for a transport error, or the body prefix for a response. */
void put_detail(Writer &w, const DeliveryResult &r, const char *body, std::size_t body_len) noexcept {
    if (r.transport_error != 0) {
        const char *m = r.transport_message;
        if (m == nullptr || m[0] == '\0') m = curl_easy_strerror(static_cast<CURLcode>(r.transport_error));
        if (m != nullptr) put_quoted(w, m, std::strlen(m), kMaxQuotedMessage);
    } else {
        put_quoted(w, body, body_len, kMaxQuotedBody);
    }
}

/* What ran out, for the local failure message. */
const char *local_resource(const DeliveryResult &r) noexcept {
    switch (r.os_errno) {
        case EMFILE:
            return "Too many open files";
        case ENFILE:
            return "Too many open files in system";
        case ENOMEM:
            return "Cannot allocate memory";
        case ENOBUFS:
            return "No buffer space available";
        default:
            return r.transport_error == CURLE_OUT_OF_MEMORY ? "out of memory" : "resource exhausted";
    }
}

bool in_defer_list(long status, const OutcomePolicy &p) noexcept {
    if (p.defer_statuses == nullptr) return false;
    for (std::size_t i = 0; i < p.n_defer_statuses; i++)
        if (p.defer_statuses[i] == status) return true;
    return false;
}

/* Retry-After as a clamped delay in ms; false when absent or unparsable. */
bool retry_after_ms(const DeliveryResult &r, const OutcomePolicy &p, int64_t now_unix_s, int64_t *ms) noexcept {
    if (r.retry_after == nullptr) return false;
    int64_t s;
    if (!parse_retry_after(r.retry_after, r.retry_after_len, now_unix_s, &s)) return false;
    int64_t max_s = p.max_retry_after_s < 0 ? 0 : p.max_retry_after_s;
    if (s > max_s) s = max_s;
    *ms = sat_mul(s, 1000);
    return true;
}

/* ------------------------------------------------------------ HTTP dates */

inline bool is_digit(char c) noexcept {
    return c >= '0' && c <= '9';
}

bool iequal_n(const char *a, const char *lit, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; i++)
        if (ascii_lower(a[i]) != ascii_lower(lit[i])) return false;
    return true;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm). */
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) noexcept {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;                                   /* [0, 399] */
    const int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1; /* [0, 365] */
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;           /* [0, 146096] */
    return era * 146097 + doe - 719468;
}

/* Inverse of days_from_civil. */
void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) noexcept {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;                                      /* [0, 146096] */
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);               /* [0, 365] */
    const int64_t mp = (5 * doy + 2) / 153;                                    /* [0, 11] */
    *d = static_cast<unsigned>(doy - (153 * mp + 2) / 5 + 1);
    *m = static_cast<unsigned>(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

bool is_leap(int64_t y) noexcept {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

unsigned days_in_month(int64_t y, unsigned m) noexcept {
    static const unsigned dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return (m == 2 && is_leap(y)) ? 29 : dim[m - 1];
}

/* A cursor over the trimmed header value. */
struct Cursor {
    const char *p;
    const char *end;

    bool at_end() const noexcept { return p == end; }
    bool lit(const char *s) noexcept {
        std::size_t n = std::strlen(s);
        if (static_cast<std::size_t>(end - p) < n || !iequal_n(p, s, n)) return false;
        p += n;
        return true;
    }
    bool digits(int n, int *out) noexcept {
        if (end - p < n) return false;
        int v = 0;
        for (int i = 0; i < n; i++) {
            if (!is_digit(p[i])) return false;
            v = v * 10 + (p[i] - '0');
        }
        p += n;
        *out = v;
        return true;
    }
    /* "Mon".."Sun" (short) or "Monday".."Sunday" (long) */
    bool day_name(bool long_form) noexcept {
        static const char *const shortn[7] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
        static const char *const longn[7] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                             "Friday", "Saturday", "Sunday"};
        for (int i = 0; i < 7; i++)
            if (lit(long_form ? longn[i] : shortn[i])) return true;
        return false;
    }
    bool month(unsigned *m) noexcept {
        static const char *const names[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        for (unsigned i = 0; i < 12; i++)
            if (lit(names[i])) {
                *m = i + 1;
                return true;
            }
        return false;
    }
    /* HH:MM:SS */
    bool time_of_day(int *h, int *mi, int *s) noexcept {
        return digits(2, h) && lit(":") && digits(2, mi) && lit(":") && digits(2, s);
    }
};

bool make_time(int64_t y, unsigned mon, int day, int h, int mi, int s, int64_t *out) noexcept {
    if (day < 1 || static_cast<unsigned>(day) > days_in_month(y, mon)) return false;
    if (h > 23 || mi > 59 || s > 60) return false; /* 60: leap second */
    *out = days_from_civil(y, mon, static_cast<unsigned>(day)) * 86400 + h * 3600 + mi * 60 + s;
    return true;
}

/* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
bool parse_imf_fixdate(Cursor c, int64_t *t) noexcept {
    int day, year, h, mi, s;
    unsigned mon;
    if (!c.day_name(false) || !c.lit(", ") || !c.digits(2, &day) || !c.lit(" ") || !c.month(&mon) || !c.lit(" ") ||
        !c.digits(4, &year) || !c.lit(" ") || !c.time_of_day(&h, &mi, &s) || !c.lit(" GMT") || !c.at_end())
        return false;
    return make_time(year, mon, day, h, mi, s, t);
}

/* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT" */
bool parse_rfc850(Cursor c, int64_t now_unix_s, int64_t *t) noexcept {
    int day, yy, h, mi, s;
    unsigned mon;
    if (!c.day_name(true) || !c.lit(", ") || !c.digits(2, &day) || !c.lit("-") || !c.month(&mon) || !c.lit("-") ||
        !c.digits(2, &yy) || !c.lit(" ") || !c.time_of_day(&h, &mi, &s) || !c.lit(" GMT") || !c.at_end())
        return false;
    /*
     * RFC 9110 5.6.7: a two-digit year that appears to be more than 50 years
     * in the future means the most recent past year with those digits.
     */
    int64_t now_y;
    unsigned now_m, now_d;
    int64_t now_days = now_unix_s / 86400 - (now_unix_s % 86400 < 0 ? 1 : 0);
    civil_from_days(now_days, &now_y, &now_m, &now_d);
    int64_t century = now_y - ((now_y % 100) + 100) % 100;
    int64_t year = century + yy;
    if (year > now_y + 50) year -= 100;
    return make_time(year, mon, day, h, mi, s, t);
}

/* asctime: "Sun Nov  6 08:49:37 1994" (day is 2DIGIT or SP DIGIT) */
bool parse_asctime(Cursor c, int64_t *t) noexcept {
    int day, year, h, mi, s;
    unsigned mon;
    if (!c.day_name(false) || !c.lit(" ") || !c.month(&mon) || !c.lit(" ")) return false;
    if (c.lit(" ")) {
        if (!c.digits(1, &day)) return false;
    } else if (!c.digits(2, &day)) {
        return false;
    }
    if (!c.lit(" ") || !c.time_of_day(&h, &mi, &s) || !c.lit(" ") || !c.digits(4, &year) || !c.at_end()) return false;
    return make_time(year, mon, day, h, mi, s, t);
}

} // namespace

/* ------------------------------------------------------------------ API */

bool status_is_retryable(long status) noexcept {
    return status == 408 || status == 425 || status == 429 || (status >= 500 && status <= 599);
}

int64_t full_jitter_ms(int attempts, const BackoffPolicy &b, uint64_t random64) noexcept {
    if (b.schedule_ms != nullptr && b.n_schedule > 0) {
        std::size_t i = attempts < 1 ? 0 : static_cast<std::size_t>(attempts) - 1;
        if (i >= b.n_schedule) i = b.n_schedule - 1;
        int64_t d = b.schedule_ms[i] < 0 ? 0 : b.schedule_ms[i];
        int64_t tenth = d / 10;
        /* d - tenth + uniform [0, 2 * tenth]; d is at most days, no overflow */
        return d - tenth + static_cast<int64_t>(mul_hi64(random64, static_cast<uint64_t>(2 * tenth) + 1));
    }
    if (b.base_ms <= 0 || b.cap_ms <= 0) return 0;
    if (attempts < 0) attempts = 0;
    /* base * 2^attempts, saturated at INT64_MAX */
    int64_t grown;
    if (attempts >= 63 || b.base_ms > (INT64_MAX >> attempts))
        grown = INT64_MAX;
    else
        grown = b.base_ms << attempts;
    int64_t ceiling = grown < b.cap_ms ? grown : b.cap_ms;
    /* uniform in [0, ceiling]; ceiling + 1 <= 2^63 fits in uint64_t */
    uint64_t span = static_cast<uint64_t>(ceiling) + 1;
    return static_cast<int64_t>(mul_hi64(random64, span));
}

int64_t local_failure_delay_ms(const BackoffPolicy &b, uint64_t random64) noexcept {
    if (b.base_ms <= 0 || b.cap_ms <= 0) return 0;
    int64_t ceiling = b.base_ms < b.cap_ms ? b.base_ms : b.cap_ms;
    int64_t half = ceiling / 2;
    /* half + uniform [0, ceiling - half]; the span fits easily in uint64_t */
    return half + static_cast<int64_t>(mul_hi64(random64, static_cast<uint64_t>(ceiling - half) + 1));
}

bool parse_retry_after(const char *v, std::size_t len, int64_t now_unix_s, int64_t *delay_s) noexcept {
    if (v == nullptr || delay_s == nullptr) return false;
    ascii_trim_ows(v, len);
    const char *p = v, *end = v + len;
    if (p == end) return false;

    if (is_digit(*p)) {
        /* delay-seconds = 1*DIGIT, saturating */
        int64_t n = 0;
        for (const char *q = p; q < end; q++) {
            if (!is_digit(*q)) return false;
            int d = *q - '0';
            n = (n > (INT64_MAX - d) / 10) ? INT64_MAX : n * 10 + d;
        }
        *delay_s = n;
        return true;
    }

    int64_t t;
    Cursor c{p, end};
    if (!parse_imf_fixdate(c, &t) && !parse_rfc850(c, now_unix_s, &t) && !parse_asctime(c, &t)) return false;
    int64_t d = sat_sub(t, now_unix_s);
    *delay_s = d > 0 ? d : 0;
    return true;
}

Outcome classify(const DeliveryResult &r, const OutcomePolicy &p, int attempts, int64_t now_unix_s, uint64_t random64,
                 const char *body, std::size_t body_len) noexcept {
    Outcome o;
    o.verdict = Verdict::Dead;
    o.delay_ms = 0;
    o.local_failure = false;
    o.error[0] = '\0';
    Writer w{o.error, sizeof o.error, 0};

    const bool transport = r.transport_error != 0;
    const long status = r.http_status;
    const bool not_http = !transport && (status < 100 || status > 599);

    if (transport && r.local_failure) {
        /* the dispatcher's own problem: neither the message nor the endpoint is charged */
        o.verdict = Verdict::Retry;
        o.local_failure = true;
        o.delay_ms = local_failure_delay_ms(p.backoff, random64);
        w.put("local resource failure in the dispatcher (");
        w.put(local_resource(r));
        w.put("); attempt not counted");
        put_detail(w, r, body, body_len);
        return o;
    }

    if (!transport && status >= 200 && status <= 299) {
        o.verdict = Verdict::Done;
        return o;
    }

    int64_t ra_ms = 0;
    const bool has_ra = retry_after_ms(r, p, now_unix_s, &ra_ms);

    if (!transport && !not_http && in_defer_list(status, p)) {
        o.verdict = Verdict::Defer;
        o.delay_ms = has_ra ? ra_ms : (p.defer_delay_ms > 0 ? p.defer_delay_ms : 0);
        w.put("deferred: ");
        put_what(w, r, not_http);
        put_detail(w, r, body, body_len);
        return o;
    }

    if (transport || not_http || status_is_retryable(status)) {
        put_what(w, r, not_http);
        if (attempts >= p.max_attempts) {
            o.verdict = Verdict::Dead;
            w.put(" after ");
            w.put_long(attempts);
            w.put(attempts == 1 ? " attempt" : " attempts");
        } else {
            o.verdict = Verdict::Retry;
            int64_t j = full_jitter_ms(attempts, p.backoff, random64);
            o.delay_ms = (has_ra && ra_ms > j) ? ra_ms : j;
        }
        put_detail(w, r, body, body_len);
        return o;
    }

    /* 1xx, 3xx (redirects are not followed), other 4xx */
    o.verdict = Verdict::Dead;
    put_what(w, r, not_http);
    put_detail(w, r, body, body_len);
    return o;
}

const char *verdict_name(Verdict v) noexcept {
    switch (v) {
        case Verdict::Done:
            return "done";
        case Verdict::Retry:
            return "retry";
        case Verdict::Defer:
            return "defer";
        case Verdict::Dead:
            return "dead";
    }
    return "dead";
}

/* ---------------------------------------------------------------- attempt log */

const char *transport_error_class(int code) noexcept {
    switch (code) {
        case 0:
            return nullptr;
        case CURLE_OPERATION_TIMEDOUT:
            return "timeout";
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
            return "dns";
        case CURLE_COULDNT_CONNECT:
            return "connect";
        case CURLE_GOT_NOTHING:
        case CURLE_WEIRD_SERVER_REPLY:
            return "protocol";
        default: {
            const char *kind = transport_kind(code);
            if (kind != nullptr && std::strcmp(kind, "TLS error") == 0) return "tls";
            if (kind != nullptr && std::strcmp(kind, "connection error") == 0) return "connection";
            return "other";
        }
    }
}

std::size_t sanitize_text(const char *text, std::size_t len, char *out, std::size_t outsz) noexcept {
    if (outsz == 0) return 0;
    out[0] = '\0';
    if (outsz < 3) return 0;
    /* put_quoted writes ": <text>": write it two bytes further, then drop them */
    Writer w{out, outsz, 0};
    put_quoted(w, text, len, outsz);
    if (w.len < 2) {
        out[0] = '\0';
        return 0;
    }
    std::memmove(out, out + 2, w.len - 2 + 1);
    return w.len - 2;
}

} // namespace od
