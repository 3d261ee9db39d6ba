/*
 * core/oauth.hpp — OAuth 2.0 client credentials (RFC 6749 section 4.4) for
 * an endpoint: the token request, the reading of its answer, and when a
 * token is refreshed and when it stops being used.
 *
 * Pure C++ (no PostgreSQL headers), noexcept.  The request goes out through
 * the worker's HttpEngine like a delivery (same egress filter, proxy and
 * TLS client certificate); the token is then shared by all workers through
 * the endpoint's shared-memory slot (src/endpoint_state.cpp).
 *
 * Nothing here ever puts the client secret or an access token into an
 * error text: a failed answer is described by its status and, for an
 * RFC 6749 5.2 error answer, the "error" code only (a short token of
 * printable ASCII), never the body.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace od {

/* Longest access token kept (it travels in every request of the endpoint). */
constexpr std::size_t kMaxAccessToken = 4096;
/* Bytes of a token endpoint's answer read at most (the rest is cut off). */
constexpr std::size_t kTokenAnswerCap = 16 * 1024;
/* Lifetime assumed when the answer has no expires_in. */
constexpr int64_t kDefaultTokenLifetimeS = 300;
/* Lifetimes are capped at this (a bogus expires_in must not pin a token for years). */
constexpr int64_t kMaxTokenLifetimeS = 86400;

struct OAuthClient {
    std::string token_url; /* empty: the endpoint does not use OAuth */
    std::string client_id;
    std::string client_secret;
    std::string scope; /* empty: none sent */
    bool enabled() const noexcept { return !token_url.empty(); }
    bool operator==(const OAuthClient &o) const noexcept {
        return token_url == o.token_url && client_id == o.client_id && client_secret == o.client_secret &&
               scope == o.scope;
    }
};

/*
 * The token request: header lines (client_secret_basic authentication:
 * "Authorization: Basic base64(form(id):form(secret))", RFC 6749 2.3.1) and
 * the form body "grant_type=client_credentials[&scope=...]".  False on
 * allocation failure.
 */
bool build_token_request(const OAuthClient &c, std::vector<std::string> &header_lines, std::string &body) noexcept;

/* application/x-www-form-urlencoded encoding of s (space as '+'), appended to out. */
void append_form_encoded(std::string &out, const char *s, std::size_t len);

struct TokenAnswer {
    bool ok = false;
    std::string access_token; /* ok: the token, checked to be a valid header value */
    int64_t lifetime_s = 0;   /* ok: expires_in, or kDefaultTokenLifetimeS; capped at kMaxTokenLifetimeS */
    char error[200] = {0};    /* !ok: why, without secrets */
};

/*
 * Read the answer of a token request.  transport_error: nonzero when no
 * HTTP answer arrived (then transport_message says why); status, body: the
 * answer.  Accepts a 200 with a JSON object holding a string access_token
 * of at most kMaxAccessToken bytes of visible ASCII, a token_type of
 * "Bearer" (any case) or none, and an optional positive expires_in.
 */
void read_token_answer(int transport_error, const char *transport_message, long status, const char *body,
                       std::size_t len, TokenAnswer &out) noexcept;

/*
 * When a token obtained at obtained_ms (any millisecond clock) with
 * lifetime_s is refreshed (refresh_at_ms: lifetime - min(60 s, lifetime / 4))
 * and after when it is no longer sent (usable_until_ms:
 * lifetime - min(5 s, lifetime / 10)), so that a refresh never has to
 * block deliveries unless the token endpoint is slower than that margin.
 */
struct TokenTimes {
    int64_t refresh_at_ms;
    int64_t usable_until_ms;
};
TokenTimes token_times(int64_t obtained_ms, int64_t lifetime_s) noexcept;

/* Delay before the next token request after failures consecutive failed ones: 1 s doubling, at most 60 s. */
int64_t token_retry_delay_ms(int failures) noexcept;

} // namespace od
