/*
 * core/signing.hpp — Standard Webhooks signatures and CloudEvents time.
 *
 * Pure C++ (no PostgreSQL headers), noexcept, allocation-free.
 *
 *   webhook-signature: v1,<base64(HMAC-SHA256(key, "<msg_id>.<timestamp>.<body>"))>
 *
 * where key is the base64-decoded part of the endpoint's "whsec_..." secret
 * and body is exactly the bytes sent.
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace od {

/* Enough for "v1," + base64 of a 32-byte MAC + NUL. */
constexpr std::size_t kSignatureSize = 3 + 44 + 1;

/*
 * Decode a "whsec_<base64>" secret into key (capacity keycap).  Returns the
 * key length, or -1 when the secret is malformed or does not fit.
 */
long decode_webhook_secret(const char *secret, std::size_t len, unsigned char *key, std::size_t keycap) noexcept;

/*
 * Write the NUL-terminated header value "v1,<base64 mac>" into out
 * (kSignatureSize bytes).  Returns false only if HMAC computation fails.
 */
bool webhook_signature(const unsigned char *key, std::size_t keylen, const char *msg_id, std::size_t idlen,
                       int64_t timestamp, const char *body, std::size_t bodylen, char out[kSignatureSize]) noexcept;

/* Enough for "YYYY-MM-DDTHH:MM:SS.uuuuuuZ" + NUL. */
constexpr std::size_t kRfc3339Size = 28;

/*
 * Format a Unix time in microseconds as RFC 3339 UTC with microseconds,
 * e.g. "2026-11-29T19:27:07.801584Z".  Returns the length written.
 */
std::size_t format_rfc3339(int64_t unix_us, char out[kRfc3339Size]) noexcept;

} // namespace od
