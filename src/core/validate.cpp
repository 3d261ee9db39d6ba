/*
 * core/validate.cpp — URL, header and secret checks (see validate.hpp).
 *
 * Written as byte scanners on purpose: they run inside triggers on every
 * INSERT into outbox.messages, so they must be cheap, and they must not
 * allocate or throw (their callers sit in PostgreSQL frames).
 */
#include "core/validate.hpp"

#include <cstring>

#include <curl/curl.h>
#include <string>

#include "core/ascii.hpp"

namespace od {
namespace {

bool is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool is_hostchar(unsigned char c) {
    /* unreserved / sub-delims / pct-encoded of RFC 3986 reg-name */
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
    return c != '\0' && std::strchr("-._~%!$&'()*+,;=", c) != nullptr;
}

int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

const char *check_ipv6_literal(const char *p, std::size_t n) {
    /* contents between the brackets: hex digits, ':' and '.' (embedded IPv4) */
    if (n < 2) return "has an empty IPv6 address";
    std::size_t colons = 0;
    for (std::size_t i = 0; i < n; i++) {
        unsigned char c = static_cast<unsigned char>(p[i]);
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (c == ':')
            colons++;
        else if (!hex && c != '.')
            return "has an invalid IPv6 address";
    }
    if (colons < 2) return "has an invalid IPv6 address";
    return nullptr;
}

} // namespace

const char *check_url(const char *url, std::size_t len) {
    if (url == nullptr || len == 0) return "is empty";
    if (len > kMaxUrlLength) return "is longer than 2048 bytes";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(url[i]);
        if (c <= 0x20 || c == 0x7f) return "contains whitespace or a control character";
        if (c >= 0x80) return "contains a non-ASCII byte (percent-encode it)";
    }
    std::size_t pos;
    if (ascii_istarts(url, len, "http://"))
        pos = 7;
    else if (ascii_istarts(url, len, "https://"))
        pos = 8;
    else
        return "must start with http:// or https://";

    /* authority runs to the first '/', '?' or '#' */
    std::size_t end = pos;
    while (end < len && url[end] != '/' && url[end] != '?' && url[end] != '#') end++;
    if (std::memchr(url + pos, '@', end - pos) != nullptr)
        return "must not contain user information (put credentials in the endpoint's headers)";
    if (std::memchr(url, '#', len) != nullptr) return "must not contain a fragment";
    if (end == pos) return "has no host";

    const char *host = url + pos;
    std::size_t hostlen;
    std::size_t port_at;
    if (host[0] == '[') {
        const char *close = static_cast<const char *>(std::memchr(host, ']', end - pos));
        if (close == nullptr) return "has an unterminated IPv6 address";
        const char *err = check_ipv6_literal(host + 1, static_cast<std::size_t>(close - host - 1));
        if (err) return err;
        hostlen = static_cast<std::size_t>(close - host) + 1;
        port_at = pos + hostlen;
        if (port_at < end && url[port_at] != ':') return "has characters after the IPv6 address";
    } else {
        const char *colon = static_cast<const char *>(std::memchr(host, ':', end - pos));
        hostlen = colon ? static_cast<std::size_t>(colon - host) : end - pos;
        port_at = pos + hostlen;
        if (hostlen == 0) return "has no host";
        if (hostlen > 253) return "has a host name longer than 253 bytes";
        for (std::size_t i = 0; i < hostlen; i++) {
            if (!is_hostchar(static_cast<unsigned char>(host[i]))) return "has an invalid character in its host";
            if (host[i] == '%') {
                /* libcurl decodes a percent-encoded host: it must decode to a host character */
                int hi = i + 2 < hostlen ? hex_value(host[i + 1]) : -1;
                int lo = i + 2 < hostlen ? hex_value(host[i + 2]) : -1;
                if (hi < 0 || lo < 0) return "has an invalid percent-encoding in its host";
                unsigned char d = static_cast<unsigned char>(hi * 16 + lo);
                if (d == '%' || !is_hostchar(d)) return "has a percent-encoded character not allowed in a host";
                i += 2;
            }
        }
    }
    if (port_at < end) {
        /* url[port_at] == ':' */
        std::size_t digits = end - port_at - 1;
        if (digits == 0) return "has an empty port";
        if (digits > 5) return "has a port outside 1-65535";
        long port = 0;
        for (std::size_t i = port_at + 1; i < end; i++) {
            if (url[i] < '0' || url[i] > '9') return "has a non-numeric port";
            port = port * 10 + (url[i] - '0');
        }
        if (port < 1 || port > 65535) return "has a port outside 1-65535";
    }
    return nullptr;
}

bool url_is_https(const char *url, std::size_t len) {
    return ascii_istarts(url, len, "https://");
}

const char *check_header_name(const char *name, std::size_t len) {
    if (name == nullptr || len == 0) return "is empty";
    if (len > 256) return "is longer than 256 bytes";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(name[i]);
        if (c == '\r' || c == '\n') return "contains a carriage return or line feed";
        if (!is_tchar(c)) return "contains a character not allowed in an HTTP header name";
    }
    return nullptr;
}

bool header_name_is_reserved(const char *name, std::size_t len) {
    static const char *const exact[] = {"host",         "content-length",  "transfer-encoding", "connection",
                                        "content-type", "idempotency-key", "x-outbox-attempt",  "expect",
                                        "te",           "upgrade",         "keep-alive",        "trailer"};
    for (const char *e : exact)
        if (ascii_iequals(name, len, e)) return true;
    return ascii_istarts(name, len, "ce-") || ascii_istarts(name, len, "webhook-");
}

bool is_blank(const char *s, std::size_t len) noexcept {
    for (std::size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t') return false;
    return true;
}

const char *check_header_value(const char *value, std::size_t len) {
    if (len > 8192) return "is longer than 8192 bytes";
    if (is_blank(value, len)) return "must not be blank";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(value[i]);
        if (c == '\r' || c == '\n') return "contains a carriage return or line feed";
        if ((c < 0x20 && c != '\t') || c == 0x7f) return "contains a control character";
    }
    return nullptr;
}

const char *check_proxy_url(const char *url, std::size_t len) noexcept {
    static const char *const schemes[] = {"http://", "https://", "socks5://", "socks5h://"};
    if (len > 2048) return "is longer than 2048 bytes";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(url[i]);
        if (c <= 0x20 || c == 0x7f) return "must not contain spaces or control characters";
    }
    for (const char *s : schemes) {
        std::size_t n = std::strlen(s);
        if (len > n) {
            if (ascii_istarts(url, len, s)) {
                /* parsed as libcurl will parse it: a URL it cannot use would be quoted whole in its error */
                CURLU *u = curl_url();
                if (u == nullptr) return "could not be checked (out of memory)";
                char copy[2049];
                std::memcpy(copy, url, len);
                copy[len] = '\0';
                CURLUcode rc = curl_url_set(u, CURLUPART_URL, copy, CURLU_NON_SUPPORT_SCHEME);
                char *host = nullptr;
                if (rc == CURLUE_OK) rc = curl_url_get(u, CURLUPART_HOST, &host, 0);
                bool ok = rc == CURLUE_OK && host != nullptr && host[0] != '\0';
                curl_free(host);
                curl_url_cleanup(u);
                return ok ? nullptr : "is not a valid URL (host, port)";
            }
        }
    }
    return "must be an http://, https://, socks5:// or socks5h:// URL with a host";
}

const char *check_pem(const char *pem, std::size_t len, bool want_key) noexcept {
    if (len > 65536) return "is longer than 64 KB";
    if (std::memchr(pem, '\0', len) != nullptr) return "contains a NUL byte";
    try {
    std::string text(pem, len);
    std::size_t at = 0;
    while ((at = text.find("-----BEGIN ", at)) != std::string::npos) {
        std::size_t end = text.find("-----", at + 11);
        if (end == std::string::npos) break;
        std::string label = text.substr(at + 11, end - at - 11);
        if (!want_key && label == "CERTIFICATE") return nullptr;
        if (want_key && label.size() >= 11 && label.compare(label.size() - 11, 11, "PRIVATE KEY") == 0) {
            if (label.find("ENCRYPTED") != std::string::npos || text.find("Proc-Type: 4,ENCRYPTED") != std::string::npos)
                return "must not be encrypted (there is no passphrase setting)";
            return nullptr;
        }
        at = end;
    }
    } catch (...) {
        return "could not be checked (out of memory)";
    }
    return want_key ? "must be a PEM private key (-----BEGIN ... PRIVATE KEY-----)"
                    : "must be a PEM certificate (-----BEGIN CERTIFICATE-----)";
}

const char *check_id_prefix(const char *prefix, std::size_t len) noexcept {
    if (len > kMaxIdPrefixBytes) return "is longer than 64 bytes";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(prefix[i]);
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                  c == '.' || c == ':';
        if (!ok) return "may contain only ASCII letters, digits, \"-\", \"_\", \".\" and \":\"";
    }
    return nullptr;
}

namespace {

bool lower_hex(const char *p, std::size_t n, bool *all_zero) noexcept {
    bool zero = true;
    for (std::size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
        if (c != '0') zero = false;
    }
    if (all_zero) *all_zero = zero;
    return true;
}

bool key_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/' || c == '@';
}

} // namespace

const char *check_traceparent(const char *v, std::size_t len) noexcept {
    static const char *const shape =
        "must be a W3C traceparent: \"00-\" + 32 lower-case hex digits + \"-\" + 16 + \"-\" + 2";
    bool zero = false;
    if (len > 512) return "is longer than 512 bytes";
    if (len < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return shape;
    if (!lower_hex(v, 2, nullptr) || !lower_hex(v + 53, 2, nullptr)) return shape;
    if (v[0] == 'f' && v[1] == 'f') return "has the invalid version ff";
    if (!lower_hex(v + 3, 32, &zero)) return shape;
    if (zero) return "has an all-zero trace-id";
    if (!lower_hex(v + 36, 16, &zero)) return shape;
    if (zero) return "has an all-zero parent-id";
    if (v[0] == '0' && v[1] == '0') {
        if (len != 55) return shape;
    } else if (len > 55 && v[55] != '-') {
        return shape;
    }
    for (std::size_t i = 55; i < len; i++)
        if (static_cast<unsigned char>(v[i]) < 0x21 || static_cast<unsigned char>(v[i]) > 0x7e) return shape;
    return nullptr;
}

const char *check_tracestate(const char *v, std::size_t len) noexcept {
    static const char *const member = "must be a W3C tracestate: comma-separated key=value members";
    if (len > 512) return "is longer than 512 bytes";
    int members = 0;
    const char *why = nullptr;
    for_each_list_element(v, len, [&](const char *m, std::size_t mlen) {
        std::size_t eq = 0;
        if (++members > 32) {
            why = "has more than 32 members";
            return false;
        }
        while (eq < mlen && m[eq] != '=') eq++;
        if (eq == mlen || eq == 0 || eq > 256 || !((m[0] >= 'a' && m[0] <= 'z') || (m[0] >= '0' && m[0] <= '9')) ||
            mlen - eq - 1 < 1 || mlen - eq - 1 > 256)
            why = member;
        for (std::size_t k = 0; k < eq && !why; k++)
            if (!key_char(m[k])) why = member;
        for (std::size_t k = eq + 1; k < mlen && !why; k++) {
            unsigned char c = static_cast<unsigned char>(m[k]);
            if (c < 0x20 || c > 0x7e || c == ',' || c == '=') why = member;
        }
        return why == nullptr;
    });
    return why;
}

long base64_decode(const char *in, std::size_t len, unsigned char *out) {
    while (len > 0 && in[len - 1] == '=') len--;
    if (len % 4 == 1) return -1;
    long n = 0;
    unsigned int acc = 0;
    int bits = 0;
    for (std::size_t i = 0; i < len; i++) {
        int v = b64_value(static_cast<unsigned char>(in[i]));
        if (v < 0) return -1;
        acc = (acc << 6) | static_cast<unsigned int>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = static_cast<unsigned char>((acc >> bits) & 0xff);
        }
    }
    return n;
}

std::size_t base64_encode(const unsigned char *in, std::size_t len, char *out) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::size_t o = 0, i = 0;
    for (; i + 2 < len; i += 3) {
        unsigned int v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
        out[o++] = tbl[(v >> 18) & 63];
        out[o++] = tbl[(v >> 12) & 63];
        out[o++] = tbl[(v >> 6) & 63];
        out[o++] = tbl[v & 63];
    }
    if (i < len) {
        unsigned int v = in[i] << 16;
        if (i + 1 < len) v |= in[i + 1] << 8;
        out[o++] = tbl[(v >> 18) & 63];
        out[o++] = tbl[(v >> 12) & 63];
        out[o++] = (i + 1 < len) ? tbl[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    return o;
}

namespace {

/* Bounded output for redact_url: appends while there is room, keeps the NUL. */
struct Out {
    char *buf;
    std::size_t cap; /* bytes available before the NUL */
    std::size_t len;
    void put(const char *s, std::size_t n) noexcept {
        if (n > cap - len) n = cap - len;
        if (n == 0) return; /* s may be nullptr then, which memcpy does not allow even for 0 bytes */
        std::memcpy(buf + len, s, n);
        len += n;
    }
};

} // namespace

std::size_t redact_url(const char *url, std::size_t len, char *out, std::size_t outsz) noexcept {
    if (out == nullptr || outsz == 0) return 0;
    Out o{out, outsz - 1, 0};
    if (url == nullptr) len = 0;

    /*
     * "scheme://": the scheme is taken to be whatever precedes the first
     * "://", as long as it is not empty and holds no '/', '?' or '#'.  That
     * is looser than RFC 3986 on purpose: the URLs worth redacting are
     * often the rejected ones (" http://u:pw@host", "htp://u:pw@host"), and
     * redaction should err on the side of hiding.
     */
    std::size_t auth = 0;
    for (std::size_t i = 0; i < len; i++) {
        char c = url[i];
        if (c == '/' || c == '?' || c == '#') break;
        if (c == ':' && i > 0 && len - i >= 3 && url[i + 1] == '/' && url[i + 2] == '/') {
            auth = i + 3;
            break;
        }
    }
    std::size_t at = 0; /* index of the last '@' of the authority, 0 = none */
    if (auth > 0) {
        for (std::size_t i = auth; i < len && url[i] != '/' && url[i] != '?' && url[i] != '#'; i++)
            if (url[i] == '@') at = i;
    }
    if (at > 0) {
        o.put(url, auth);
        o.put("***", 3);
        o.put(url + at, len - at);
    } else {
        o.put(url, len);
    }
    out[o.len] = '\0';
    return o.len;
}

const char *check_signing_secret(const char *secret, std::size_t len) {
    if (len < 6 || std::strncmp(secret, "whsec_", 6) != 0) return "must start with \"whsec_\"";
    const char *b64 = secret + 6;
    std::size_t blen = len - 6;
    if (blen > (kMaxSecretBytes * 4) / 3 + 4) return "is longer than 256 bytes once decoded";
    unsigned char buf[kMaxSecretBytes + 8];
    long n = base64_decode(b64, blen, buf);
    if (n < 0) return "is not valid base64 after \"whsec_\"";
    if (static_cast<std::size_t>(n) < kMinSecretBytes) return "is shorter than 16 bytes once decoded";
    if (static_cast<std::size_t>(n) > kMaxSecretBytes) return "is longer than 256 bytes once decoded";
    return nullptr;
}

const char *check_oauth_value(const char *v, std::size_t len, bool scope) noexcept {
    if (len == 0) return "must not be empty";
    if (len > 1000) return "is longer than 1000 bytes";
    for (std::size_t i = 0; i < len; i++) {
        unsigned char c = static_cast<unsigned char>(v[i]);
        if (c < 0x20 || c == 0x7f) return "contains a control character";
        if (scope && (c == '"' || c == '\\' || c > 0x7e))
            return "may contain only visible ASCII characters other than '\"' and '\\' (RFC 6749 section 3.3), separated by spaces";
    }
    if (scope && is_blank(v, len)) return "must not be blank";
    return nullptr;
}

namespace {

bool text_is(const char *s, std::size_t len, const char *word) noexcept {
    return len == std::strlen(word) && std::memcmp(s, word, len) == 0;
}

} // namespace

bool message_status_is_valid(const char *status, std::size_t len) noexcept {
    return text_is(status, len, "pending") || text_is(status, len, "processing") || text_is(status, len, "done") ||
           text_is(status, len, "dead");
}

bool message_lease_is_consistent(const char *status, std::size_t len, bool has_lease) noexcept {
    return text_is(status, len, "processing") == has_lease;
}

} // namespace od
