/*
 * core/replication_gate.cpp — see replication_gate.hpp.
 */
#include "core/replication_gate.hpp"

namespace od {

int64_t replication_hold_limit_us(int64_t lease_us) noexcept {
    const int64_t lo = 10 * 1000;
    const int64_t hi = 5 * 1000 * 1000;
    int64_t q = lease_us / 4;
    if (q < lo) return lo;
    if (q > hi) return hi;
    return q;
}

void gate_claimed(ReplicationGate &g, uint64_t lsn, int64_t now) noexcept {
    if (lsn == 0) return;
    g.awaiting_lsn = lsn;
    g.awaiting_since = now;
}

GateStep gate_step(ReplicationGate &g, uint64_t confirmed, int64_t now, int64_t hold_limit_us) noexcept {
    if (g.stalled_lsn != 0 && confirmed >= g.stalled_lsn) g.stalled_lsn = 0;
    if (g.awaiting_lsn == 0) return GateStep::Send;
    if (confirmed >= g.awaiting_lsn) {
        g.awaiting_lsn = 0;
        g.awaiting_since = 0;
        return GateStep::Send;
    }
    if (now - g.awaiting_since >= hold_limit_us) {
        g.stalled_lsn = g.awaiting_lsn;
        g.awaiting_lsn = 0;
        g.awaiting_since = 0;
        return GateStep::Release;
    }
    return GateStep::Hold;
}

bool gate_may_claim(const ReplicationGate &g, uint64_t confirmed) noexcept {
    if (g.awaiting_lsn != 0 && confirmed < g.awaiting_lsn) return false;
    if (g.stalled_lsn != 0 && confirmed < g.stalled_lsn) return false;
    return true;
}

} // namespace od
