/*
 * core/validate.hpp — pure C++ checks of everything that ends up on the
 * wire: endpoint URLs, HTTP header names and values, signing secrets.
 *
 * No PostgreSQL headers here.  The functions never throw and never
 * allocate: they return nullptr when the input is acceptable, or a static
 * English sentence fragment describing the problem, which the caller turns
 * into an ereport() (see src/triggers.cpp).  That keeps C++ objects off the
 * stack of any frame that may longjmp.
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace od {

/* Upper bound on the length of an endpoint URL, in bytes. */
constexpr std::size_t kMaxUrlLength = 2048;

/*
 * An endpoint URL: http:// or https:// (any letter case), a non-empty host
 * (a name, an IPv4 address or a bracketed IPv6 literal), an optional numeric
 * port 1-65535, an optional path and query.  No userinfo, no fragment, no
 * whitespace or control characters, at most kMaxUrlLength bytes.
 */
const char *check_url(const char *url, std::size_t len);

/* true when the URL's scheme is https (checked URLs only). */
bool url_is_https(const char *url, std::size_t len);

/*
 * An HTTP header field name: a non-empty RFC 9110 token (letters, digits
 * and !#$%&'*+-.^_`|~), at most 256 bytes.
 */
const char *check_header_name(const char *name, std::size_t len);

/*
 * A name users may not set themselves: framing headers (Host,
 * Content-Length, Transfer-Encoding, Connection) and the headers the
 * dispatcher owns (Content-Type, Idempotency-Key, X-Outbox-Attempt, ce-*,
 * webhook-*).  Case-insensitive.
 */
bool header_name_is_reserved(const char *name, std::size_t len);

/* true when s is empty or only spaces and horizontal tabs. */
bool is_blank(const char *s, std::size_t len) noexcept;

/*
 * An HTTP header field value: not blank (is_blank: a header without a
 * value, which libcurl would not even send), no CR, LF, NUL or other
 * control character except horizontal tab, at most 8192 bytes.  Bytes
 * >= 0x80 are allowed (obs-text).  Leading and trailing whitespace is
 * accepted (HTTP strips it).
 */
const char *check_header_value(const char *value, std::size_t len);

/*
 * A proxy URL (endpoints.proxy, outbox_dispatcher.proxy): http://, https://,
 * socks5:// or socks5h:// (scheme in any case) followed by a host, at most
 * 2048 bytes, no whitespace or control characters.  The problem never quotes
 * the value (it may hold a password).
 */
const char *check_proxy_url(const char *url, std::size_t len) noexcept;

/*
 * PEM text for TLS client authentication: at most 64 KB, no NUL, and with
 * a "-----BEGIN <label>-----" line where label is "CERTIFICATE" (want_key
 * false) or ends in "PRIVATE KEY" (want_key true).  Never quotes the value.
 */
const char *check_pem(const char *pem, std::size_t len, bool want_key) noexcept;

/*
 * An OAuth 2.0 client id or secret (scope false): 1 to 1000 bytes without
 * control characters; or a scope (scope true): 1 to 1000 bytes of
 * space-separated scope tokens (RFC 6749 3.3: visible ASCII but '"' and
 * '\\').  Never quotes the value.
 */
const char *check_oauth_value(const char *v, std::size_t len, bool scope) noexcept;

/* Longest outbox_dispatcher.message_id_prefix, in bytes. */
constexpr std::size_t kMaxIdPrefixBytes = 64;

/*
 * outbox_dispatcher.message_id_prefix: empty, or at most kMaxIdPrefixBytes
 * of ASCII letters, digits and '-', '_', '.', ':' (it goes into three
 * headers and into the signed content, where nothing may need escaping).
 */
const char *check_id_prefix(const char *prefix, std::size_t len) noexcept;

/*
 * W3C Trace Context (level 1) header values, as captured at enqueue
 * (outbox_dispatcher.traceparent / .tracestate, or the message's own
 * traceparent / tracestate headers):
 *   traceparent: version "00": exactly "00-<32 hex>-<16 hex>-<2 hex>",
 *     lower-case hex, trace-id and parent-id not all zeros; a later version
 *     (not "ff") may append "-..." after those 55 bytes (at most 512 bytes).
 *   tracestate: at most 512 bytes and 32 list members "key=value" separated
 *     by commas (optional spaces or tabs around each member, empty members
 *     ignored); key: a lower-case letter or digit then up to 255 of
 *     a-z 0-9 _ - * / @; value: 1 to 256 printable ASCII bytes other than
 *     ',' and '=', not ending in a space.
 * nullptr when valid, else the problem ("must ...").
 */
const char *check_traceparent(const char *value, std::size_t len) noexcept;
const char *check_tracestate(const char *value, std::size_t len) noexcept;

/* Largest decoded secret accepted, in bytes. */
constexpr std::size_t kMaxSecretBytes = 256;
/* Smallest decoded secret accepted, in bytes. */
constexpr std::size_t kMinSecretBytes = 16;

/*
 * A Standard Webhooks signing secret: "whsec_" followed by standard base64
 * (with padding optional) of kMinSecretBytes..kMaxSecretBytes bytes.
 */
const char *check_signing_secret(const char *secret, std::size_t len);

/*
 * Decode standard base64 (RFC 4648, padding optional) into out, which must
 * hold at least len * 3 / 4 + 3 bytes.  Returns the number of bytes written,
 * or -1 when the input is not valid base64.
 */
long base64_decode(const char *in, std::size_t len, unsigned char *out);

/* Encode standard base64 with padding; out must hold 4 * ((len + 2) / 3) bytes. */
std::size_t base64_encode(const unsigned char *in, std::size_t len, char *out);

/*
 * A URL fit for an error message: copied into out, NUL-terminated and cut
 * to outsz - 1 bytes, with the userinfo of its authority replaced by
 * "***" (the URL https://user:pw@host/x keeps "https:", "//" and "@host/x",
 * with "***" in place of "user:pw").  The authority is what follows
 * "scheme://" up to the first '/', '?' or '#' (the scheme being any
 * non-empty text without '/', '?', '#' before the first "://", so that
 * malformed URLs are redacted too); the userinfo is everything in it
 * before its last '@'.  Other URLs are copied unchanged, control
 * characters included (quoting is the caller's business).  A cut never
 * exposes part of the userinfo.  Returns the number of bytes written
 * before the NUL; outsz 0 writes nothing.
 */
std::size_t redact_url(const char *url, std::size_t len, char *out, std::size_t outsz) noexcept;

/*
 * The two CHECK constraints of outbox.messages (see _message_status_valid
 * in the extension script for why they are C functions).
 * messages_status_check: status is pending, processing, done or dead
 * (exactly: no other case, no padding).
 */
bool message_status_is_valid(const char *status, std::size_t len) noexcept;

/* messages_lease_check: a row has a lease (lease_until set) exactly when its status is processing. */
bool message_lease_is_consistent(const char *status, std::size_t len, bool has_lease) noexcept;

} // namespace od
