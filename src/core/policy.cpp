/*
 * core/policy.cpp — what an answered delivery means for its endpoint (see
 * policy.hpp).
 */
#include "core/policy.hpp"

namespace od {

EndpointSignal endpoint_signal(Verdict v, long http_status) noexcept {
    switch (v) {
        case Verdict::Done:
            return EndpointSignal::Success;
        case Verdict::Retry:
            return EndpointSignal::Failure; // retryable status or transport error
        case Verdict::Dead:
            // retries exhausted on a transport error or a 5xx count; a 4xx verdict does not
            return (http_status == 0 || http_status >= 500) ? EndpointSignal::Failure : EndpointSignal::Neutral;
        case Verdict::Defer:
            return EndpointSignal::Neutral;
    }
    return EndpointSignal::Neutral;
}

bool answer_disables_endpoint(long http_status) noexcept {
    return http_status == 410;
}

GoneFinalize finalize_after_gone(int64_t defer_delay_ms) noexcept {
    return GoneFinalize{Verdict::Retry, defer_delay_ms, true, "HTTP 410 Gone: the endpoint was disabled"};
}

} // namespace od
