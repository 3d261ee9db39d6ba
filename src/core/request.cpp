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

#include "core/ascii.hpp"

#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "core/signing.hpp"

namespace od {
namespace {

/* Length of the name of a "Name: value" line: the bytes before the first ':'. */
std::size_t name_length(const std::string &line) noexcept {
    std::size_t p = line.find(':');
    return p == std::string::npos ? line.size() : p;
}

/* Do the two lines carry the same header name (case-insensitive)? */
bool same_name(const std::string &a, const std::string &b) noexcept {
    std::size_t n = name_length(a);
    if (name_length(b) != n) return false;
    for (std::size_t i = 0; i < n; i++)
        if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
    return true;
}

/* Is the line's header name `name` (lower-case), in any letter case? */
bool has_name(const std::string &line, const char *name) noexcept {
    std::size_t n = name_length(line);
    if (std::strlen(name) != n) return false;
    for (std::size_t i = 0; i < n; i++)
        if (ascii_lower(line[i]) != name[i]) return false;
    return true;
}

bool named_by_endpoint(const std::string &line, const std::vector<std::string> &endpoint_headers) noexcept {
    for (const std::string &e : endpoint_headers)
        if (same_name(line, e)) return true;
    return false;
}

/* "name: " + the value percent-encoded (a ce-* header). */
std::string ce_header(const char *name, const char *value, std::size_t len) {
    std::string line(name);
    line += ": ";
    append_ce_encoded(line, value, len);
    return line;
}

std::string ce_header(const char *name, const std::string &value) {
    return ce_header(name, value.data(), value.size());
}

} // namespace

void append_ce_encoded(std::string &out, const char *value, std::size_t len) {
    static const char hex[] = "0123456789ABCDEF";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(value[i]);
        if (c <= 0x20 || c >= 0x7F || c == '"' || c == '%') {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 0xF];
        } else {
            out += static_cast<char>(c);
        }
    }
}

bool build_request_headers(const MessageHead &m, const WireSettings &wire,
                           const std::vector<std::string> &endpoint_headers,
                           const std::vector<std::string> &message_headers, const SigningKey *keys, std::size_t nkeys,
                           int64_t now_unix_s, const char *body, std::size_t body_len,
                           std::vector<std::string> &out) noexcept {
    try {
        std::string id = wire.id_prefix + std::to_string(static_cast<long long>(m.id));
        char when[kRfc3339Size];
        format_rfc3339(m.created_at_unix_us, when);
        std::string subject = std::string(m.aggregate_type) + "/" + m.aggregate_id;

        out.emplace_back("Content-Type: application/json");
        out.emplace_back("Idempotency-Key: " + id);
        out.emplace_back("ce-specversion: 1.0");
        out.push_back(ce_header("ce-id", id));
        out.push_back(ce_header("ce-source", wire.source));
        out.push_back(ce_header("ce-type", m.event_type, std::strlen(m.event_type)));
        out.push_back(ce_header("ce-subject", subject));
        out.emplace_back(std::string("ce-time: ") + when);
        /* trace context (sent as the message's own headers below): the CloudEvents extension attributes too */
        for (const char *name : {"traceparent", "tracestate"}) {
            for (const std::string &h : message_headers) {
                if (!has_name(h, name) || named_by_endpoint(h, endpoint_headers)) continue;
                std::size_t v = name_length(h) + 1;
                while (v < h.size() && (h[v] == ' ' || h[v] == '\t')) v++;
                out.push_back(ce_header((std::string("ce-") + name).c_str(), h.data() + v, h.size() - v));
                break;
            }
        }
        out.emplace_back("X-Outbox-Attempt: " + std::to_string(m.attempts));
        for (const std::string &h : endpoint_headers) out.push_back(h);
        for (const std::string &h : message_headers)
            if (!named_by_endpoint(h, endpoint_headers)) out.push_back(h); /* the endpoint's wins */
        if (nkeys > 0) {
            std::string sigs("webhook-signature: ");
            for (std::size_t k = 0; k < nkeys; k++) {
                char sig[kSignatureSize];
                if (!webhook_signature(keys[k].key, keys[k].len, id.data(), id.size(), now_unix_s, body, body_len, sig))
                    return false;
                if (k > 0) sigs += ' ';
                sigs += sig;
            }
            out.emplace_back("webhook-id: " + id);
            out.emplace_back("webhook-timestamp: " + std::to_string(now_unix_s));
            out.push_back(std::move(sigs));
        }
        return true;
    } catch (...) {
        return false;
    }
}

} // namespace od
