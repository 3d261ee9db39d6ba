/*
 * ready_floor.cpp — where a worker's claim starts reading an endpoint's
 * ready messages (see ready_floor.hpp).
 */
#include "ready_floor.hpp"

namespace od {

int64_t ready_scan_from(const ReadyFloor &f, int64_t now_us) noexcept {
    if (!f.known) return kReadFromFirst;
    /* written as a difference of known-order values: no overflow */
    if (now_us < f.full_scan_us || now_us - f.full_scan_us >= kReadyFullScanUs) return kReadFromFirst;
    return f.floor_us;
}

void ready_floor_claimed(ReadyFloor &f, int64_t now_us, int64_t scanned_from, int64_t claim_start_us, int claimed,
                         int64_t min_available_us) noexcept {
    /* a claimed message was available at the claim's start: never above it */
    int64_t base = claimed > 0 && min_available_us < claim_start_us ? min_available_us : claim_start_us;

    if (scanned_from == kReadFromFirst) f.full_scan_us = now_us;
    if (base < kReadFromFirst + kReadyFloorLagUs) {
        /* -infinity or as good as: nothing to skip */
        f.known = false;
        return;
    }
    f.floor_us = base - kReadyFloorLagUs;
    f.known = true;
}

} // namespace od
