/*
 * worker_wait.cpp — the worker's one wait: its latch, postmaster death and
 * the HTTP engine's sockets (through its one poll descriptor), in one
 * WaitEventSet built once.  See worker.h.
 */
#include "worker.h"

namespace odw {

/* ---------------------------------------------------------------- waiting */

/*
 * The one wait set, built once: the latch, postmaster death and the
 * engine's poll descriptor (an epoll set libcurl's sockets enter and leave
 * without touching this one; core/http_engine.hpp).
 */
static WaitEventSet *
wait_set(void)
{
    if (W.wait_set == nullptr)
    {
        WaitEventSet *set = od_create_wait_event_set(3);

        AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
        AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
        AddWaitEventToSet(set, WL_SOCKET_READABLE, W.disp->engine().poll_fd(), nullptr, nullptr);
        W.wait_set = set;
    }
    return W.wait_set;
}

/* Wait up to timeout_ms for sockets or the latch; returns true if the latch was set. */
bool
wait_for_events(long timeout_ms)
{
    WaitEvent events[3];
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

    nev = WaitEventSetWait(wait_set(), timeout_ms, events, lengthof(events), PG_WAIT_EXTENSION);

    for (int i = 0; i < nev; i++)
    {
        if (events[i].events & WL_LATCH_SET)
        {
            ResetLatch(MyLatch);
            woken = true;
        }
        else if (events[i].events & WL_SOCKET_READABLE)
            W.disp->engine().on_poll_ready();
    }
    if (W.disp->engine().timeout_ms() == 0)
        W.disp->engine().on_timeout();
    return woken;
}

} // namespace odw
