/*
 * core/request.cpp — wire headers of one delivery (see request.hpp).
 *
 * A message header named like one of the endpoint's headers is dropped:
 * the endpoint's configuration is the operator's, the message's headers
 * are the producer's, and a producer must not be able to send a second
 * Authorization (or X-Tenant, ...) next to the endpoint's, which receivers
 * resolve in different ways (first wins, last wins, joined with a comma).
 */
#include "core/request.hpp"

#include <cstdio>
#include <cstring>

#include "core/signing.hpp"

namespace od {
namespace {

/* Length of the name of a "Name: value" line: the bytes before the first ':'. */
std::size_t name_length(const std::string &line) noexcept {
    std::size_t p = line.find(':');
    return p == std::string::npos ? line.size() : p;
}

inline char lower(char c) noexcept {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

/* Do the two lines carry the same header name (case-insensitive)? */
bool same_name(const std::string &a, const std::string &b) noexcept {
    std::size_t n = name_length(a);
    if (name_length(b) != n) return false;
    for (std::size_t i = 0; i < n; i++)
        if (lower(a[i]) != lower(b[i])) return false;
    return true;
}

bool named_by_endpoint(const std::string &line, const std::vector<std::string> &endpoint_headers) noexcept {
    for (const std::string &e : endpoint_headers)
        if (same_name(line, e)) return true;
    return false;
}

} // namespace

bool build_request_headers(const MessageHead &m, const std::string &source,
                           const std::vector<std::string> &endpoint_headers,
                           const std::vector<std::string> &message_headers, const unsigned char *key,
                           std::size_t keylen, int64_t now_unix_s, const char *body, std::size_t body_len,
                           std::vector<std::string> &out) noexcept {
    try {
        char id[24];
        int idlen = std::snprintf(id, sizeof id, "%lld", static_cast<long long>(m.id));
        char when[kRfc3339Size];
        format_rfc3339(m.created_at_unix_us, when);

        out.emplace_back("Content-Type: application/json");
        out.emplace_back(std::string("Idempotency-Key: ") + id);
        out.emplace_back("ce-specversion: 1.0");
        out.emplace_back(std::string("ce-id: ") + id);
        out.emplace_back("ce-source: " + source);
        out.emplace_back(std::string("ce-type: ") + m.event_type);
        out.emplace_back(std::string("ce-subject: ") + m.aggregate_type + "/" + m.aggregate_id);
        out.emplace_back(std::string("ce-time: ") + when);
        out.emplace_back("X-Outbox-Attempt: " + std::to_string(m.attempts));
        for (const std::string &h : endpoint_headers) out.push_back(h);
        for (const std::string &h : message_headers)
            if (!named_by_endpoint(h, endpoint_headers)) out.push_back(h); /* the endpoint's wins */
        if (keylen > 0) {
            char sig[kSignatureSize];
            if (!webhook_signature(key, keylen, id, static_cast<std::size_t>(idlen), now_unix_s, body, body_len, sig))
                return false;
            out.emplace_back(std::string("webhook-id: ") + id);
            out.emplace_back("webhook-timestamp: " + std::to_string(now_unix_s));
            out.emplace_back(std::string("webhook-signature: ") + sig);
        }
        return true;
    } catch (...) {
        return false;
    }
}

} // namespace od
