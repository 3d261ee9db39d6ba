/*
 * core/request.hpp — the HTTP headers of one delivery (the wire contract).
 *
 * Pure C++ (no PostgreSQL headers).  For a message and its endpoint this
 * builds, in order:
 *   Content-Type: application/json
 *   Idempotency-Key: <prefix><id>
 *   ce-specversion: 1.0, ce-id, ce-source, ce-type, ce-subject, ce-time
 *     (values percent-encoded as the CloudEvents HTTP binding requires)
 *   ce-traceparent, ce-tracestate (the CloudEvents distributed-tracing
 *     extension) when the message has a traceparent (tracestate) header
 *   X-Outbox-Attempt: <attempts>
 *   the endpoint's headers, then the message's headers (a message header
 *   with the name of one of the endpoint's, in any letter case, is dropped)
 *   webhook-id, webhook-timestamp, webhook-signature (when the endpoint has a
 *   secret; one signature per valid secret during a rotation)
 * The signature covers exactly `body`, the bytes that are sent.
 * Header names and values were validated when the rows were written
 * (src/core/validate.cpp); event_type and the aggregate were checked for
 * CR/LF there too.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace od {

struct MessageHead {
    int64_t id;
    int attempts;
    const char *event_type;
    const char *aggregate_type;
    const char *aggregate_id;
    int64_t created_at_unix_us;
};

/* What every request of a worker shares. */
struct WireSettings {
    std::string source;    /* ce-source */
    std::string id_prefix; /* before the id in Idempotency-Key, ce-id, webhook-id (outbox_dispatcher.message_id_prefix) */
};

/* One decoded signing secret. */
struct SigningKey {
    const unsigned char *key;
    std::size_t len;
};

/*
 * Appends the header lines to out.  keys: the endpoint's valid signing
 * secrets, newest first (nkeys 0 = unsigned); webhook-signature carries one
 * "v1,<signature>" per key, space-separated, in that order.  now_unix_s:
 * webhook-timestamp.  Returns false on allocation or HMAC failure (out is
 * then unspecified).
 */
bool build_request_headers(const MessageHead &m, const WireSettings &wire,
                           const std::vector<std::string> &endpoint_headers,
                           const std::vector<std::string> &message_headers, const SigningKey *keys, std::size_t nkeys,
                           int64_t now_unix_s, const char *body, std::size_t body_len,
                           std::vector<std::string> &out) noexcept;

/*
 * Appends value to out percent-encoded as the CloudEvents HTTP binding
 * (3.1.3.2) requires of ce-* header values: every byte outside U+0021..U+007E,
 * and space, '"' and '%', becomes %XX (upper-case hex of the UTF-8 bytes).
 */
void append_ce_encoded(std::string &out, const char *value, std::size_t len);

} // namespace od
