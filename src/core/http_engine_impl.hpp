/*
 * core/http_engine_impl.hpp — what the two halves of HttpEngine share
 * (http_engine.cpp: transfers through libcurl; http_direct.cpp: plain
 * http:// over the engine's own keep-alive connections).  Internal: only
 * those two files include it.
 */
#pragma once

#include <curl/curl.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/http1.hpp"
#include "core/http_engine.hpp"

namespace od {

/*
 * One easy handle and its buffers: a transfer libcurl carries whole, or
 * (ex set) the connect of an exchange of the own transport, which ends
 * once libcurl has a connected socket.
 */
struct HttpEngine::Transfer {
    CURL *easy = nullptr;
    curl_slist *headers = nullptr;
    std::string body;
    std::string url;
    char errbuf[CURL_ERROR_SIZE];
    HttpCompletion result;
    std::size_t body_seen = 0;
    bool body_overflow = false;
    /* header blocks seen by the header callback (see the file comment of http_engine.cpp) */
    long block_status = 0;         /* status of the block being read */
    bool in_block = false;         /* a status line arrived, its empty line not yet */
    bool headers_complete = false; /* a final (>= 200) block has ended */
    int socket_errno = 0;          /* errno of a failed socket(), 0 if none */
    const AddressFilter *filter = nullptr;
    std::string proxy;         /* the proxy URL used, to keep it (and its password) out of error texts */
    std::size_t keep_body = 0; /* TransferOptions::keep_body */
    std::string kept;          /* the body kept whole, up to keep_body bytes */
    bool denied = false;       /* a connection was refused by the filter */
    char denied_why[160];      /* why (the address and the list) */
    Exchange *ex = nullptr;    /* connecting for this exchange (CURLOPT_CONNECT_ONLY) */
};

/* A keep-alive connection of the own transport; its descriptor is the engine's alone. */
struct HttpEngine::Conn {
    int fd = -1;
    std::string key;           /* http1::PlainUrl::key of its origin */
    uint64_t generation = 0;   /* the address filter's generation when it was opened */
    uint32_t events = 0;       /* epoll interest registered; 0 = not in the set */
    int64_t idle_since_us = 0; /* steady clock, while pooled */
    Exchange *ex = nullptr;    /* the exchange using it; nullptr while pooled */
};

/* One request of the own transport, from submit() to its completion. */
struct HttpEngine::Exchange {
    HttpCompletion result;
    std::string url;     /* for libcurl's connect */
    std::string key;     /* the origin's pool key */
    std::string request; /* the bytes to send (http1::write_post) */
    std::size_t sent = 0;
    http1::ResponseParser parser;
    Conn *conn = nullptr;
    Transfer *connecting = nullptr;  /* libcurl's connect, while there is no conn */
    uint64_t connect_generation = 0; /* the address filter's generation when that connect started */
    int64_t start_us = 0;
    int64_t deadline_us = 0;
    long timeout_ms = 0;
    bool reused = false;  /* conn came from the pool (it may have died there) */
    bool retried = false; /* sent again once on a fresh connection already */
    std::size_t keep_body = 0;
    std::string kept;
    std::size_t body_seen = 0;
    bool body_overflow = false;
    std::size_t slot = 0; /* index in HttpEngine::exchanges_ */
};

namespace engine_detail {

/* epoll data of a connection of the own transport: kOwnConnBit | Conn* (libcurl's sockets: the descriptor) */
constexpr uint64_t kOwnConnBit = 1ull << 63;

int64_t steady_us() noexcept;

/* errno values that mean "this process ran out of something" (HttpCompletion::local_failure). */
inline bool errno_is_local(long e) {
    return e == EMFILE || e == ENFILE || e == ENOMEM || e == ENOBUFS;
}

/* Every occurrence of secret in text becomes "<proxy>". */
void redact(char *text, std::size_t cap, const std::string &secret) noexcept;

/*
 * Body bytes of a response: the first kBodyCap into r.body, up to keep_body
 * into kept (keep_body becomes 0 when memory runs out); false once more
 * than kBodyAbort arrived (overflow set).
 */
bool take_body_bytes(HttpCompletion &r, std::size_t &seen, bool &overflow, std::size_t &keep_body, std::string &kept,
                     const char *data, std::size_t n) noexcept;

/* The response's Retry-After value, cut to what HttpCompletion holds (both transports). */
inline void set_retry_after(HttpCompletion &r, const char *v, std::size_t len) noexcept {
    r.retry_after_len = len < sizeof r.retry_after - 1 ? len : sizeof r.retry_after - 1;
    std::memcpy(r.retry_after, v, r.retry_after_len);
    r.retry_after[r.retry_after_len] = '\0';
}

/* The completion of a transfer (or connect) libcurl ended with code; why overrides libcurl's text. */
void describe_failure(HttpEngine::Transfer *t, CURLcode code, const char *why, long os_errno,
                      HttpCompletion &r) noexcept;

} // namespace engine_detail
} // namespace od
