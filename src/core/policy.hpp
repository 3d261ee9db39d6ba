/*
 * core/policy.hpp — what an answered delivery means for its endpoint.
 *
 * The message's own fate (done, retry, defer, dead; delay; refund) comes
 * from classify() in core/outcome.hpp.  These rules decide the rest, from
 * that verdict and the HTTP status:
 *
 *   answer                                   breaker signal   endpoint
 *   2xx                                      success          -
 *   retry verdict (408, 425, 429, 5xx,       failure          -
 *     transport errors), and dead after
 *     retries ran out on 5xx or a transport
 *     error
 *   other dead (3xx, 4xx, also 408/425/429   neutral          -
 *     once retries ran out), defer
 *   410 Gone                                 neutral          disabled; the message goes back to
 *                                                             pending after defer_delay with its
 *                                                             attempt refunded
 *
 * A request that was never sent, or failed on this side (out of file
 * descriptors, released at shutdown), gives no signal at all: the caller
 * does not ask.
 */
#pragma once

#include <cstdint>

#include "core/outcome.hpp"

namespace od {

enum class EndpointSignal { Success, Failure, Neutral };

/* The circuit breaker's reading of an answered delivery. */
EndpointSignal endpoint_signal(Verdict v, long http_status) noexcept;

/* Whether this answer disables the endpoint (410 Gone). */
bool answer_disables_endpoint(long http_status) noexcept;

/* How a message whose answer disabled its endpoint is finalized. */
struct GoneFinalize {
    Verdict verdict;
    int64_t delay_ms;
    bool refund;
    const char *error;
};
GoneFinalize finalize_after_gone(int64_t defer_delay_ms) noexcept;

} // namespace od
