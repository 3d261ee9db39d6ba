/*
 * worker_wait.cpp — the worker's one wait: its latch, postmaster death and
 * the sockets the HTTP engine asks for, in one WaitEventSet rebuilt only
 * when the sockets change.  See worker.h.
 */
#include "worker.h"

namespace odw {

/* ---------------------------------------------------------------- waiting */

static void
rebuild_wait_set(void)
{
    const std::vector<od::HttpSocket> &socks = W.disp->engine().sockets();

    WaitEventSet                      *old = W.wait_set;
    WaitEventSet                      *set;

    /*
     * Build the new set completely before letting go of the old one: an
     * ERROR while building leaves wait_set pointing at a valid set (the
     * half-built one is released with its memory at the next rebuild).
     */
    set = od_create_wait_event_set((int) socks.size() + 2);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    for (const od::HttpSocket &s : socks)
    {
        uint32 ev = (s.want_read ? WL_SOCKET_READABLE : 0) | (s.want_write ? WL_SOCKET_WRITEABLE : 0);

        AddWaitEventToSet(set, ev, s.fd, nullptr, nullptr);
    }
    W.wait_set = set;
    if (old)
        FreeWaitEventSet(old);
}

/* Wait up to timeout_ms for sockets or the latch; returns true if the latch was set. */
bool
wait_for_events(long timeout_ms)
{
    WaitEvent events[64];
    int       nev;
    bool      woken = false;
    long      curl_ms = W.disp->engine().timeout_ms();

    if (curl_ms == 0)
    {
        W.disp->engine().on_timeout();
        curl_ms = W.disp->engine().timeout_ms();
    }
    if (curl_ms >= 0 && (timeout_ms < 0 || curl_ms < timeout_ms))
        timeout_ms = curl_ms;
    if (W.disp->engine().completed() > 0)
        timeout_ms = 0; /* transfers finished while being kicked: do not sleep on them */
    if (W.disp->engine().sockets_changed() || W.wait_set == nullptr)
        rebuild_wait_set();

    nev = WaitEventSetWait(W.wait_set, timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);

    for (int i = 0; i < nev; i++)
    {
        if (events[i].events & WL_LATCH_SET)
        {
            ResetLatch(MyLatch);
            woken = true;
        }
        else if (events[i].events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
            W.disp->engine().on_socket(events[i].fd, (events[i].events & WL_SOCKET_READABLE) != 0,
                                       (events[i].events & WL_SOCKET_WRITEABLE) != 0);
    }
    if (W.disp->engine().timeout_ms() == 0)
        W.disp->engine().on_timeout();
    return woken;
}

} // namespace odw
