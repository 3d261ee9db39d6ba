/*
 * core/signing.cpp — Standard Webhooks signatures and RFC 3339 time (see
 * signing.hpp).
 *
 * The MAC is computed incrementally over "<msg_id>", ".", "<timestamp>",
 * ".", "<body>" so the body, which may be large, is never copied: HMAC
 * (RFC 2104) written out over SHA-256 from EVP, with the digest fetched
 * once per thread and one digest context reused (see sha256() for why),
 * giving exactly HMAC-SHA256(key, "<msg_id>.<timestamp>.<body>").  OpenSSL
 * may allocate internally (with malloc, never palloc); this file does not,
 * and it wipes the decoded secret and the key pads from its own stack.
 *
 * Decisions the header leaves open, made here:
 *
 *  - decode_webhook_secret accepts exactly what the endpoint trigger accepts
 *    (check_signing_secret: "whsec_" + base64 of 16..256 bytes), so the
 *    worker never signs with a secret the database would have refused.
 *
 *  - format_rfc3339 uses floor division, so instants before 1970 come out
 *    right (-1 us is 1969-12-31T23:59:59.999999Z).  RFC 3339 has four-digit
 *    years only; instants outside 0000-01-01 .. 9999-12-31 are clamped to
 *    those bounds, so the output is always exactly 27 characters.
 */
#include "core/signing.hpp"

#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include "core/validate.hpp"

namespace od {
namespace {

constexpr std::size_t kMacSize = 32;                                 /* SHA-256 */
constexpr std::size_t kMaxSecretB64 = (kMaxSecretBytes * 4) / 3 + 4; /* generous */

/* Decimal digits of v (sign included) into out (>= 21 bytes); returns the length. */
std::size_t format_int64(int64_t v, char *out) noexcept {
    char tmp[24];
    std::size_t n = 0;
    /* work on the negative value so INT64_MIN is fine */
    int64_t x = v < 0 ? v : -v;
    do {
        tmp[n++] = static_cast<char>('0' - x % 10);
        x /= 10;
    } while (x != 0);
    std::size_t o = 0;
    if (v < 0) out[o++] = '-';
    while (n > 0) out[o++] = tmp[--n];
    return o;
}

struct MacPart {
    const void *data;
    std::size_t len;
};

/*
 * SHA-256 through EVP with the algorithm fetched once per process (thread):
 * fetching it, as one-shot HMAC and EVP_MAC do on every call under
 * OpenSSL 3, cost more than hashing a message (31,000 instructions per
 * signature, measured with test/bench/http_path_bench.sh).
 */
const EVP_MD *sha256() noexcept {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    static thread_local EVP_MD *md = nullptr;
    if (md == nullptr) md = EVP_MD_fetch(nullptr, "SHA2-256", nullptr);
    return md;
#else
    return EVP_sha256();
#endif
}

/* SHA-256 of prefix (block bytes) followed by the parts, into out; false on an OpenSSL failure. */
bool sha256_parts(EVP_MD_CTX *ctx, const EVP_MD *md, const unsigned char *prefix, std::size_t prefix_len,
                  const MacPart *parts, std::size_t nparts, unsigned char out[kMacSize]) noexcept {
    bool ok = EVP_DigestInit_ex(ctx, md, nullptr) == 1;
    if (prefix_len > 0) ok = ok && EVP_DigestUpdate(ctx, prefix, prefix_len) == 1;
    for (std::size_t i = 0; ok && i < nparts; i++)
        ok = parts[i].len == 0 || EVP_DigestUpdate(ctx, parts[i].data, parts[i].len) == 1;
    unsigned int outl = 0;
    return ok && EVP_DigestFinal_ex(ctx, out, &outl) == 1 && outl == kMacSize;
}

/* HMAC-SHA256 (RFC 2104) over the concatenated parts. */
bool hmac_sha256(const unsigned char *key, std::size_t keylen, const MacPart *parts, std::size_t nparts,
                 unsigned char mac[kMacSize]) noexcept {
    constexpr std::size_t kBlock = 64; /* SHA-256 block size */
    const EVP_MD *md = sha256();
    static thread_local EVP_MD_CTX *ctx = nullptr;
    if (ctx == nullptr) ctx = EVP_MD_CTX_new();
    if (md == nullptr || ctx == nullptr) return false;

    unsigned char k0[kBlock];
    std::memset(k0, 0, sizeof k0);
    bool ok = true;
    if (key != nullptr && keylen > kBlock) {
        MacPart whole{key, keylen};
        ok = sha256_parts(ctx, md, nullptr, 0, &whole, 1, k0); /* a longer key is hashed first */
    } else if (key != nullptr && keylen > 0) {
        std::memcpy(k0, key, keylen);
    }
    unsigned char pad[kBlock];
    unsigned char inner[kMacSize];
    for (std::size_t i = 0; i < kBlock; i++) pad[i] = static_cast<unsigned char>(k0[i] ^ 0x36);
    ok = ok && sha256_parts(ctx, md, pad, kBlock, parts, nparts, inner);
    for (std::size_t i = 0; i < kBlock; i++) pad[i] = static_cast<unsigned char>(k0[i] ^ 0x5c);
    MacPart in{inner, kMacSize};
    ok = ok && sha256_parts(ctx, md, pad, kBlock, &in, 1, mac);
    OPENSSL_cleanse(k0, sizeof k0);
    OPENSSL_cleanse(pad, sizeof pad);
    OPENSSL_cleanse(inner, sizeof inner);
    return ok;
}

void put2(char *p, unsigned v) noexcept {
    p[0] = static_cast<char>('0' + v / 10);
    p[1] = static_cast<char>('0' + v % 10);
}

/* Gregorian date of a day count since 1970-01-01 (H. Hinnant's civil_from_days). */
void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) noexcept {
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    *d = static_cast<unsigned>(doy - (153 * mp + 2) / 5 + 1);
    *m = static_cast<unsigned>(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

int64_t floor_div(int64_t a, int64_t b) noexcept {
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q; /* b > 0 */
}

} // namespace

long decode_webhook_secret(const char *secret, std::size_t len, unsigned char *key, std::size_t keycap) noexcept {
    if (secret == nullptr || key == nullptr) return -1;
    if (check_signing_secret(secret, len) != nullptr) return -1;
    const char *b64 = secret + 6;
    std::size_t blen = len - 6;
    if (blen > kMaxSecretB64) return -1;
    unsigned char buf[kMaxSecretB64 * 3 / 4 + 3]; /* what base64_decode may write */
    long n = base64_decode(b64, blen, buf);
    long result = -1;
    if (n >= 0 && static_cast<std::size_t>(n) <= keycap) {
        std::memcpy(key, buf, static_cast<std::size_t>(n));
        result = n;
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return result;
}

bool webhook_signature(const unsigned char *key, std::size_t keylen, const char *msg_id, std::size_t idlen,
                       int64_t timestamp, const char *body, std::size_t bodylen, char out[kSignatureSize]) noexcept {
    out[0] = '\0';
    char ts[24];
    std::size_t tslen = format_int64(timestamp, ts);
    static const char dot = '.';
    MacPart parts[5] = {{msg_id != nullptr ? msg_id : "", msg_id != nullptr ? idlen : 0},
                        {&dot, 1},
                        {ts, tslen},
                        {&dot, 1},
                        {body != nullptr ? body : "", body != nullptr ? bodylen : 0}};
    unsigned char mac[kMacSize];
    if (!hmac_sha256(key, keylen, parts, 5, mac)) return false;
    std::memcpy(out, "v1,", 3);
    std::size_t n = base64_encode(mac, kMacSize, out + 3); /* 44 characters */
    out[3 + n] = '\0';
    OPENSSL_cleanse(mac, sizeof mac);
    return true;
}

std::size_t format_rfc3339(int64_t unix_us, char out[kRfc3339Size]) noexcept {
    /* 0000-01-01T00:00:00Z and 10000-01-01T00:00:00Z in Unix seconds */
    constexpr int64_t kMinUs = -62167219200LL * 1000000;
    constexpr int64_t kMaxUs = 253402300800LL * 1000000 - 1;
    if (unix_us < kMinUs) unix_us = kMinUs;
    if (unix_us > kMaxUs) unix_us = kMaxUs;

    int64_t secs = floor_div(unix_us, 1000000);
    unsigned us = static_cast<unsigned>(unix_us - secs * 1000000);
    int64_t days = floor_div(secs, 86400);
    unsigned sod = static_cast<unsigned>(secs - days * 86400);
    int64_t y;
    unsigned m, d;
    civil_from_days(days, &y, &m, &d);
    unsigned year = static_cast<unsigned>(y); /* 0..9999 after clamping */

    char *p = out;
    put2(p, year / 100);
    put2(p + 2, year % 100);
    p[4] = '-';
    put2(p + 5, m);
    p[7] = '-';
    put2(p + 8, d);
    p[10] = 'T';
    put2(p + 11, sod / 3600);
    p[13] = ':';
    put2(p + 14, sod / 60 % 60);
    p[16] = ':';
    put2(p + 17, sod % 60);
    p[19] = '.';
    put2(p + 20, us / 10000);
    put2(p + 22, us / 100 % 100);
    put2(p + 24, us % 100);
    p[26] = 'Z';
    p[27] = '\0';
    return 27;
}

} // namespace od
