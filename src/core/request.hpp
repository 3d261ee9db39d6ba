/*
 * core/request.hpp — the HTTP headers of one delivery (the wire contract).
 *
 * Pure C++ (no PostgreSQL headers).  For a message and its endpoint this
 * builds, in order:
 *   Content-Type: application/json
 *   Idempotency-Key: <id>
 *   ce-specversion: 1.0, ce-id, ce-source, ce-type, ce-subject, ce-time
 *   X-Outbox-Attempt: <attempts>
 *   the endpoint's headers, then the message's headers (a message header
 *   with the name of one of the endpoint's, in any letter case, is dropped)
 *   webhook-id, webhook-timestamp, webhook-signature (when the endpoint has a secret)
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

/*
 * Appends the header lines to out.  key/keylen: the decoded signing secret
 * (keylen 0 = unsigned).  now_unix_s: webhook-timestamp.  Returns false on
 * allocation or HMAC failure (out is then unspecified).
 */
bool build_request_headers(const MessageHead &m, const std::string &source,
                           const std::vector<std::string> &endpoint_headers,
                           const std::vector<std::string> &message_headers, const unsigned char *key,
                           std::size_t keylen, int64_t now_unix_s, const char *body, std::size_t body_len,
                           std::vector<std::string> &out) noexcept;

} // namespace od
