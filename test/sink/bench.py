#!/usr/bin/python3
"""Rough keep-alive throughput check for sink.py.

    /usr/bin/python3 test/sink/bench.py PORT [--threads 8] [--seconds 5] [--path /bench]

Each thread keeps one HTTP/1.1 connection open and POSTs small JSON bodies
with distinct Idempotency-Keys; prints requests/s.  Note that the client runs
in the same interpreter family and competes for CPU with the sink, so the
figure is a lower bound of what the sink serves to libcurl.
"""
import argparse
import http.client
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--path", default="/bench")
    a = ap.parse_args()
    counts = [0] * a.threads
    errors = [0] * a.threads
    stop = time.monotonic() + a.seconds
    body = b'{"order_id":42,"amount":"12.50","currency":"EUR","note":"bench"}'

    def worker(i):
        c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
        n = 0
        while time.monotonic() < stop:
            key = "t%d-%d" % (i, n)
            try:
                c.request("POST", a.path, body, {
                    "Content-Type": "application/json", "Idempotency-Key": key,
                    "ce-id": key, "ce-type": "order.created", "ce-specversion": "1.0",
                    "X-Outbox-Attempt": "1"})
                r = c.getresponse()
                r.read()
                if r.status != 200 or r.will_close:
                    errors[i] += 1
            except OSError:
                errors[i] += 1
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=10)
            n += 1
        counts[i] = n
        c.close()

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    total = sum(counts)
    print("requests=%d errors=%d seconds=%.2f rate=%.0f req/s" % (total, sum(errors), dt, total / dt))


if __name__ == "__main__":
    main()
