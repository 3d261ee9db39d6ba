/*
 * ready_floor.cpp — where a worker's claim starts reading an endpoint's
 * ready messages (see ready_floor.hpp).
 */
#include "ready_floor.hpp"

namespace od {

ReadyKey ready_scan_from(const ReadyFloor &f, int64_t now_us) noexcept {
    if (!f.known) return kFirstKey;
    /* written as a difference of known-order values: no overflow */
    if (now_us < f.full_scan_us || now_us - f.full_scan_us >= kReadyFullScanUs) return kFirstKey;
    return f.floor;
}

void ready_floor_claimed(ReadyFloor &f, int64_t now_us, const ReadyKey &scanned_from, int64_t claim_start_us,
                         int claimed, const ReadyKey &first_claimed) noexcept {
    if (ready_key_is_first(scanned_from)) f.full_scan_us = now_us;
    if (claim_start_us < kReadFromFirst + kReadyFloorLagUs) {
        /* a start at -infinity, or as good as: nothing to skip */
        f.known = false;
        return;
    }
    /* the claim's start less the lag, or the first row it took when that is older */
    ReadyKey cut{ claim_start_us - kReadyFloorLagUs, INT64_MIN };

    f.floor = claimed > 0 && ready_key_less(first_claimed, cut) ? first_claimed : cut;
    f.known = !ready_key_is_first(f.floor);
}

} // namespace od
