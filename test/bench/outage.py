#!/usr/bin/python3
"""
outage.py — a measured long endpoint outage: how the circuit breaker and a
per-endpoint retry_schedule combine (issue 14).

TIME-SCALED.  Every duration of the real scenario is divided by OUTAGE_SCALE
(default 60): the 2-hour outage (OUTAGE_SECONDS = 7200) lasts 120 s, the
Standard Webhooks schedule {5s,5min,30min,2h,5h,10h,10h} becomes
{100ms,5s,30s,2min,5min,10min,10min} (5 s / 60 = 83 ms is below the 100 ms
minimum of the retry_schedule domain, so the first delay is 100 ms: 6 s in
real-time terms), breaker_cooldown 30 s becomes 500 ms, breaker_threshold
stays 5.  NOT scaled: the 1-hour cap on the doubled cool-down
(BREAKER_MAX_COOLDOWN_US in src/endpoint_state.cpp, C, not configurable), so
in the scaled run the cool-down keeps doubling where real time would stop at
1 h; the script also computes the real-time probe times with the cap.  Also
not scaled: request latencies and the workers' claim timing, in particular
outbox_dispatcher.poll_interval (1 s): a retry whose delay has passed, the
first probe after the breaker opened and the messages waiting behind a
successful probe are claimed at the next poll (or commit), not at the exact
instant, so up to 1 s scaled (1 min "real") is added there — set
OUTAGE_POLL_INTERVAL=17ms to scale it too; disable_after (default 5 days; 2 h scaled would not be
reached either).  Every figure is printed in scaled seconds and multiplied
back by the scale ("real").

The scenario, on a throwaway cluster (/tmp/outage_<label>/pgdata, unix
socket only, port OUTAGE_PG_PORT) and test/sink/sink.py (127.0.0.1,
OUTAGE_SINK_PORT):
  - one endpoint 'hook' -> http://127.0.0.1:<sink>/hook with the scaled
    retry_schedule, max_attempts NULL (one more than the schedule has
    delays: 8), breaker_cooldown scaled, breaker_threshold
    OUTAGE_BREAKER_THRESHOLD (default 5; 0 = no breaker, the comparison);
    every other setting default, outbox_dispatcher.workers = 2;
  - the sink answers 503 on /hook from before the first attempt (an HTTP
    failure rather than a closed port: the sink records every attempt with
    its arrival time and X-Outbox-Attempt, which a refused connection would
    not; both are retryable failures to the dispatcher and the breaker);
  - N (default 50) messages are inserted while the workers are paused, then
    the workers are enabled: that instant is t = 0, the start of the outage;
  - OUTAGE_DURING (default 10) more are enqueued during the outage, at
    k * outage / (OUTAGE_DURING + 1), k = 1 ..;
  - at t = outage the sink switches /hook to 200 (recovery);
  - then the script waits until every message is done or dead (or
    OUTAGE_TIMEOUT scaled seconds after the start).
outbox.endpoint_health is sampled every second (state, trips,
consecutive_failures, opened_at, next_probe_at, failing_since) with the
message counts by status.

Per message it records the attempts used (outbox.messages.attempts, checked
against the requests the sink saw), the arrival time of every attempt at
the sink, and the delivery (arrival of the request answered 200) after the
recovery.  Output: tables on stdout; /tmp/outage_<label>/result.json
(everything), messages.tsv (one line per message), requests.jsonl (the sink's
log), postgres.log.

Run as the postgres user (initdb refuses root), from anywhere:
    runuser -u postgres -- python3 test/bench/outage.py
    runuser -u postgres -- env OUTAGE_BREAKER_THRESHOLD=0 python3 test/bench/outage.py

Environment: OUTAGE_SCALE (60), OUTAGE_SECONDS (7200, real time), N (50),
OUTAGE_DURING (10), OUTAGE_BREAKER_THRESHOLD (5), OUTAGE_WORKERS (2),
OUTAGE_TIMEOUT (scaled seconds from the start; default outage + the
longest scaled delay + 120), OUTAGE_PG_PORT (54801), OUTAGE_SINK_PORT
(54802), OUTAGE_POLL_INTERVAL (empty: the default 1s, not scaled; 17ms is
1 s / 60, for a check of what the unscaled poll adds), OUTAGE_LABEL
(breaker<threshold>[_poll<interval>]), OUTAGE_KEEP (1: keep the data
directory).  Standard library + the PostgreSQL binaries (pg_config --bindir).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

SCALE = float(os.environ.get("OUTAGE_SCALE", "60"))
OUTAGE_REAL = float(os.environ.get("OUTAGE_SECONDS", "7200"))
N = int(os.environ.get("N", "50"))
DURING = int(os.environ.get("OUTAGE_DURING", "10"))
THRESHOLD = int(os.environ.get("OUTAGE_BREAKER_THRESHOLD", "5"))
WORKERS = int(os.environ.get("OUTAGE_WORKERS", "2"))
PG_PORT = int(os.environ.get("OUTAGE_PG_PORT", "54801"))
SINK_PORT = int(os.environ.get("OUTAGE_SINK_PORT", "54802"))
POLL = os.environ.get("OUTAGE_POLL_INTERVAL", "")  # e.g. 17ms; empty: the default (1s), not scaled
LABEL = os.environ.get("OUTAGE_LABEL", "breaker%d" % THRESHOLD + ("_poll" + POLL if POLL else ""))
KEEP = os.environ.get("OUTAGE_KEEP", "0") == "1"
WORK = "/tmp/outage_" + LABEL
DATA = os.path.join(WORK, "pgdata")
SRC = os.path.dirname(os.path.abspath(__file__)) + "/../.."
PGBIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()

# the real-time scenario
REAL_SCHEDULE_S = [5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600]  # Standard Webhooks
REAL_COOLDOWN_S = 30.0
BREAKER_MAX_COOLDOWN_S = 3600.0   # src/endpoint_state.cpp, not scaled
MIN_SCHEDULE_MS = 100             # domain retry_schedule
MIN_COOLDOWN_MS = 100             # domain breaker_cooldown

SCHEDULE_MS = [max(MIN_SCHEDULE_MS, int(round(s * 1000.0 / SCALE))) for s in REAL_SCHEDULE_S]
COOLDOWN_MS = max(MIN_COOLDOWN_MS, int(round(REAL_COOLDOWN_S * 1000.0 / SCALE)))
OUTAGE = OUTAGE_REAL / SCALE
TIMEOUT = float(os.environ.get("OUTAGE_TIMEOUT", str(OUTAGE + max(SCHEDULE_MS) / 1000.0 + 120)))


def log(msg=""):
    print(msg, flush=True)


def real(s):
    """scaled seconds -> real time as h:mm:ss (or m:ss)"""
    if s is None:
        return "-"
    r = s * SCALE
    neg = r < 0
    r = abs(r)
    h, rem = divmod(int(round(r)), 3600)
    m, sec = divmod(rem, 60)
    txt = ("%d:%02d:%02d" % (h, m, sec)) if h else ("%d:%02d" % (m, sec))
    return ("-" if neg else "") + txt


def fmt_ms(ms):
    return "%gms" % ms if ms < 1000 else ("%gs" % (ms / 1000.0) if ms < 60000 else "%gmin" % (ms / 60000.0))


# ---------------------------------------------------------------- cluster and sink

def sql(*stmts):
    args = [PGBIN + "/psql", "-h", WORK, "-p", str(PG_PORT), "-U", "postgres", "-d", "postgres",
            "-XAtq", "-v", "ON_ERROR_STOP=1", "-F", "|"]
    for s in stmts:
        args += ["-c", s]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("psql failed: %s\n%s" % (stmts, r.stderr))
    return r.stdout.strip()


def start_cluster():
    os.makedirs(WORK, exist_ok=True)
    shutil.rmtree(DATA, ignore_errors=True)
    subprocess.run([PGBIN + "/initdb", "-D", DATA, "-A", "trust", "-U", "postgres"],
                   check=True, stdout=subprocess.DEVNULL)
    conf = {
        "shared_preload_libraries": "'outbox_dispatcher'",
        "port": str(PG_PORT),
        "listen_addresses": "''",
        "unix_socket_directories": "'%s'" % WORK,
        "outbox_dispatcher.workers": str(WORKERS),
        "outbox_dispatcher.enabled": "off",
        "log_line_prefix": "'%m [%p] '",
    }
    if POLL:
        conf["outbox_dispatcher.poll_interval"] = "'%s'" % POLL
    with open(os.path.join(DATA, "postgresql.conf"), "a") as f:
        for k, v in conf.items():
            f.write("%s = %s\n" % (k, v))
    subprocess.run([PGBIN + "/pg_ctl", "-D", DATA, "-l", os.path.join(WORK, "postgres.log"), "-w", "start"],
                   check=True, stdout=subprocess.DEVNULL)


def stop_cluster():
    subprocess.run([PGBIN + "/pg_ctl", "-D", DATA, "-m", "fast", "-w", "stop"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not KEEP:
        shutil.rmtree(DATA, ignore_errors=True)


def set_enabled(on):
    sql("ALTER SYSTEM SET outbox_dispatcher.enabled = %s" % ("on" if on else "off"), "SELECT pg_reload_conf()")
    for _ in range(400):
        states = sql("SELECT string_agg(state, ',') FROM outbox.worker_stats")
        if on and "paused" not in states:
            return
        if not on and all(s == "paused" for s in states.split(",") if s):
            return
        time.sleep(0.025)
    raise RuntimeError("workers did not switch to enabled=%s (%s)" % (on, states))


def start_sink():
    pf = os.path.join(WORK, "sink.port")
    if os.path.exists(pf):
        os.unlink(pf)
    reqlog = os.path.join(WORK, "requests.jsonl")
    if os.path.exists(reqlog):
        os.unlink(reqlog)
    proc = subprocess.Popen(["/usr/bin/python3", os.path.join(SRC, "test/sink/sink.py"), "--port", str(SINK_PORT),
                             "--port-file", pf, "--log", reqlog, "--watch-pid", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(pf) and open(pf).read().strip():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("sink did not start on port %d" % SINK_PORT)


def sink_call(path, doc=None):
    url = "http://127.0.0.1:%d%s" % (SINK_PORT, path)
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read().decode() or "null")


# ---------------------------------------------------------------- sampling

HEALTH_SQL = (
    "SELECT extract(epoch FROM clock_timestamp()), h.state, h.trips, h.consecutive_failures,"
    "       extract(epoch FROM h.opened_at), extract(epoch FROM h.next_probe_at),"
    "       extract(epoch FROM h.failing_since), h.delivered, h.failed,"
    "       (SELECT count(*) FROM outbox.messages WHERE status = 'pending'),"
    "       (SELECT count(*) FROM outbox.messages WHERE status = 'processing'),"
    "       (SELECT count(*) FROM outbox.messages WHERE status = 'done'),"
    "       (SELECT count(*) FROM outbox.messages WHERE status = 'dead')"
    "  FROM outbox.endpoint_health AS h WHERE h.endpoint = 'hook'")


def fnum(x):
    return float(x) if x not in ("", None) else None


class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.samples = []
        self.stop_ev = threading.Event()

    def run(self):
        nxt = time.time()
        while not self.stop_ev.is_set():
            try:
                f = sql(HEALTH_SQL).split("|")
                self.samples.append({
                    "t": float(f[0]), "state": f[1], "trips": int(f[2] or 0), "consecutive_failures": int(f[3] or 0),
                    "opened_at": fnum(f[4]), "next_probe_at": fnum(f[5]), "failing_since": fnum(f[6]),
                    "delivered": int(f[7] or 0), "failed": int(f[8] or 0),
                    "pending": int(f[9]), "processing": int(f[10]), "done": int(f[11]), "dead": int(f[12])})
            except Exception as e:  # a sample lost is not a reason to stop the run
                self.samples.append({"t": time.time(), "error": str(e)})
            nxt += 1.0
            self.stop_ev.wait(max(0.0, nxt - time.time()))


# ---------------------------------------------------------------- the run

def enqueue_sql(n, tag):
    return ("INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
            " SELECT 'order', '%s-' || g, 'order.created', jsonb_build_object('n', g), 'hook'"
            " FROM generate_series(1, %d) g" % (tag, n))


def median(xs):
    return statistics.median(xs) if xs else None


def mmm(xs):
    return (min(xs), median(xs), max(xs)) if xs else (None, None, None)


def real_probe_times(outage_real, first_open_real=0.0):
    """Real-time probe instants (s from the first opening) with the real cool-down and its 1 h cap,
    request times taken as 0: every probe fails until the outage ends, the first one after it succeeds."""
    t, trips, out = first_open_real, 0, []
    while True:
        c = REAL_COOLDOWN_S
        for _ in range(trips):
            if c >= BREAKER_MAX_COOLDOWN_S:
                break
            c *= 2
        c = min(c, BREAKER_MAX_COOLDOWN_S)
        t += c
        trips += 1
        out.append((trips, c, t))
        if t >= outage_real:
            return out


def main():
    if os.geteuid() == 0:
        sys.exit("run as the postgres user: runuser -u postgres -- python3 %s" % sys.argv[0])
    log("outage.py [%s]: TIME-SCALED 1/%g — a %s outage lasts %.1f s" % (LABEL, SCALE, real(OUTAGE), OUTAGE))
    log("  retry_schedule {%s} (real {%s}%s), max_attempts NULL -> %d, breaker_threshold %d, breaker_cooldown %dms"
        " (real %gs), cap on the doubled cool-down 1 h NOT scaled"
        % (",".join(fmt_ms(x) for x in SCHEDULE_MS), ",".join(fmt_ms(s * 1000) for s in REAL_SCHEDULE_S),
           "; 5s/%g = %.0fms is below the 100ms minimum: 100ms used, %gs real" % (SCALE, 5000 / SCALE, 0.1 * SCALE)
           if REAL_SCHEDULE_S[0] * 1000.0 / SCALE < MIN_SCHEDULE_MS else "",
           len(SCHEDULE_MS) + 1, THRESHOLD, COOLDOWN_MS, REAL_COOLDOWN_S))
    log("  %d messages waiting at the start, %d enqueued during the outage, %d workers, poll_interval %s;"
        " work dir %s" % (N, DURING, WORKERS, POLL or "1s (default, NOT scaled)", WORK))

    os.makedirs(WORK, exist_ok=True)
    sink = start_sink()
    start_cluster()
    sampler = None
    try:
        sql("CREATE EXTENSION outbox_dispatcher")
        sched = "{%s}" % ",".join("%d milliseconds" % x for x in SCHEDULE_MS)
        sql("INSERT INTO outbox.endpoints (name, url, retry_schedule, breaker_threshold, breaker_cooldown)"
            " VALUES ('hook', 'http://127.0.0.1:%d/hook', '%s', %d, '%d milliseconds')"
            % (SINK_PORT, sched, THRESHOLD, COOLDOWN_MS))
        ep = sql("SELECT retry_schedule, coalesce(max_attempts, array_length(retry_schedule, 1) + 1),"
                 " breaker_threshold, breaker_cooldown, disable_after FROM outbox.endpoints WHERE name = 'hook'")
        log("  endpoint: retry_schedule|max_attempts|breaker_threshold|breaker_cooldown|disable_after = %s" % ep)
        sink_call("/_control/reset", {})
        sink_call("/_control/script", {"path": "/hook", "status": 503})
        sql(enqueue_sql(N, "pre"))

        sampler = Sampler()
        sampler.start()
        t0 = time.time()
        set_enabled(True)
        log("  t=0: workers enabled, the endpoint answers 503")

        during_at = [OUTAGE * k / (DURING + 1) for k in range(1, DURING + 1)]
        for k, at in enumerate(during_at, 1):
            time.sleep(max(0.0, t0 + at - time.time()))
            sql(enqueue_sql(1, "during%d" % k))
        time.sleep(max(0.0, t0 + OUTAGE - time.time()))
        t_rec = time.time()
        sink_call("/_control/script", {"path": "/hook", "status": 200})
        t_rec_done = time.time()
        log("  t=%.3f: recovery, the endpoint answers 200 (switch took %.1f ms)"
            % (t_rec - t0, (t_rec_done - t_rec) * 1000))

        deadline = t0 + TIMEOUT
        open_left = None
        while time.time() < deadline:
            open_left = int(sql("SELECT count(*) FROM outbox.messages WHERE status IN ('pending', 'processing')"))
            if open_left == 0:
                break
            time.sleep(0.2)
        t_end = time.time()
        sampler.stop_ev.set()
        sampler.join()
        timed_out = open_left != 0
        log("  t=%.1f: %s" % (t_end - t0, "TIMEOUT, %d messages still open" % open_left if timed_out
                               else "every message is done or dead"))

        rows = sql("SELECT id, aggregate_id, extract(epoch FROM created_at), status, attempts,"
                   " extract(epoch FROM done_at), extract(epoch FROM dead_at), coalesce(last_error, '')"
                   " FROM outbox.messages ORDER BY id")
        health_end = sql("SELECT state, trips, delivered, failed FROM outbox.endpoint_health WHERE endpoint = 'hook'")
    finally:
        if sampler is not None:
            sampler.stop_ev.set()
        try:
            reqs = sink_call("/_control/requests?path=/hook")
        except Exception:
            reqs = []
        stop_cluster()
        sink.terminate()
        sink.wait(10)

    report(t0, t_rec, t_end, timed_out, rows, reqs, sampler.samples, health_end)


def report(t0, t_rec, t_end, timed_out, rows, reqs, samples, health_end):
    rel = lambda t: None if t is None else t - t0
    msgs = {}
    for line in rows.splitlines():
        f = line.split("|", 7)
        msgs[int(f[0])] = {"id": int(f[0]), "aggregate_id": f[1], "created": rel(float(f[2])), "status": f[3],
                           "attempts": int(f[4]), "done_at": rel(fnum(f[5])), "dead_at": rel(fnum(f[6])),
                           "last_error": f[7], "arrivals": []}
    for r in reqs:
        key = r["headers_lc"].get("idempotency-key", "")
        try:
            mid = int(key)
        except ValueError:
            continue
        if mid in msgs:
            msgs[mid]["arrivals"].append({"t": rel(r["t"]), "status": r["status"],
                                          "attempt": int(r["headers_lc"].get("x-outbox-attempt", "0") or 0)})
    rec = t_rec - t0
    for m in msgs.values():
        m["group"] = "before" if m["aggregate_id"].startswith("pre-") else "during"
        ok = [a for a in m["arrivals"] if a["status"] == 200]
        m["delivered"] = ok[0]["t"] if ok else None
        m["delay_after_recovery"] = ok[0]["t"] - rec if ok else None
        m["sink_requests"] = len(m["arrivals"])

    allm = sorted(msgs.values(), key=lambda m: m["id"])
    mismatch = [m["id"] for m in allm if m["sink_requests"] != m["attempts"]]
    dup_ok = [m["id"] for m in allm if sum(1 for a in m["arrivals"] if a["status"] == 200) > 1]

    # ---- files
    with open(os.path.join(WORK, "messages.tsv"), "w") as f:
        f.write("id\tgroup\tenqueued_s\tstatus\tattempts\tsink_requests\tattempt_arrivals_s(status)\t"
                "delivered_s\tdelay_after_recovery_s\tdelay_after_recovery_real\n")
        for m in allm:
            f.write("%d\t%s\t%.3f\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n" % (
                m["id"], m["group"], m["created"], m["status"], m["attempts"], m["sink_requests"],
                " ".join("%.3f(%s)" % (a["t"], a["status"]) for a in m["arrivals"]),
                "%.3f" % m["delivered"] if m["delivered"] is not None else "-",
                "%.3f" % m["delay_after_recovery"] if m["delay_after_recovery"] is not None else "-",
                real(m["delay_after_recovery"])))
    with open(os.path.join(WORK, "result.json"), "w") as f:
        json.dump({"label": LABEL, "scale": SCALE, "outage_real_s": OUTAGE_REAL, "outage_scaled_s": OUTAGE,
                   "schedule_ms": SCHEDULE_MS, "cooldown_ms": COOLDOWN_MS, "breaker_threshold": THRESHOLD,
                   "workers": WORKERS, "t0_unix": t0, "recovery_s": rec, "end_s": t_end - t0,
                   "timed_out": timed_out, "messages": allm,
                   "samples": [dict(s, t=rel(s["t"]), opened_at=rel(s.get("opened_at")),
                                    next_probe_at=rel(s.get("next_probe_at")),
                                    failing_since=rel(s.get("failing_since"))) if "error" not in s else s
                               for s in samples]}, f, indent=1)

    # ---- summary
    log()
    log("== %s: %d messages (%d waiting at t=0, %d enqueued during the outage); outage 0 .. %.3f s scaled"
        " (0 .. %s real)%s" % (LABEL, len(allm), sum(m["group"] == "before" for m in allm),
                               sum(m["group"] == "during" for m in allm), rec, real(rec),
                               "; TIMED OUT" if timed_out else ""))
    st = {}
    for m in allm:
        st[m["status"]] = st.get(m["status"], 0) + 1
    log("   final status: %s; max_attempts %d; requests at the sink: %d (%d answered 503, %d answered 200)"
        % (", ".join("%s %d" % kv for kv in sorted(st.items())), len(SCHEDULE_MS) + 1, len(reqs),
           sum(1 for r in reqs if r["status"] == 503), sum(1 for r in reqs if r["status"] == 200)))
    log("   attempts (outbox.messages) = requests the sink saw, per message: %s; messages answered 200 twice: %s"
        % ("yes" if not mismatch else "NO for ids %s" % mismatch, dup_ok or "none"))
    log()
    hdr = "   %-28s %-8s %10s %10s %10s   %9s %9s %9s"
    log(hdr % ("", "group", "min", "median", "max", "min", "median", "max"))
    log(hdr % ("", "", "(scaled s)", "", "", "(real)", "", ""))
    for grp in ("all", "before", "during"):
        sel = [m for m in allm if grp == "all" or m["group"] == grp]
        a = mmm([m["attempts"] for m in sel])
        d = mmm([m["delay_after_recovery"] for m in sel if m["delay_after_recovery"] is not None])
        log("   %-28s %-8s %10s %10s %10s   %9s %9s %9s" % (("attempts used", grp) + tuple(
            "%g" % x if x is not None else "-" for x in a) + ("", "", "")))
        log("   %-28s %-8s %10s %10s %10s   %9s %9s %9s" % (("delivered after recovery", grp) + tuple(
            "%.3f" % x if x is not None else "-" for x in d) + tuple(real(x) for x in d)))
    first_ok_t = min([m["delivered"] for m in allm if m["delivered"] is not None] or [None]) \
        if any(m["delivered"] is not None for m in allm) else None
    if first_ok_t is not None:
        w = mmm([m["delivered"] - first_ok_t for m in allm if m["delivered"] is not None])
        log("   %-37s %10.3f %10.3f %10.3f   %s" % ("delivered after the first 200", w[0], w[1], w[2],
                                                  "wall clock, NOT scaled (claim/poll timing)"))
        log("   the first 200 came %.3f s after the recovery (%s real); the rest within %.3f s of it: that part is"
            " the workers' claim timing (%s), which x%g overstates"
            % (first_ok_t - rec, real(first_ok_t - rec), w[2],
               "poll_interval %s" % POLL if POLL else "poll_interval 1 s, not scaled", SCALE))
    hist = {}
    for m in allm:
        hist[m["attempts"]] = hist.get(m["attempts"], 0) + 1
    log("   messages by attempts used: %s" % ", ".join("%d attempt%s: %d" % (k, "" if k == 1 else "s", v)
                                                   for k, v in sorted(hist.items())))

    # ---- attempts by number: when they hit the sink (from the message's enqueue)
    log()
    log("   attempt n hit the sink (time since the message was enqueued; jittered schedule):")
    log("   %-4s %6s %6s   %-33s %-33s" % ("n", "count", "503", "since enqueue min/med/max (s)", "real min/med/max"))
    byn = {}
    for m in allm:
        for a in m["arrivals"]:
            byn.setdefault(a["attempt"], []).append((a["t"] - m["created"], a["status"]))
    for n in sorted(byn):
        xs = [x for x, _ in byn[n]]
        lo, me, hi = mmm(xs)
        log("   %-4d %6d %6d   %-33s %-33s" % (n, len(xs), sum(1 for _, s in byn[n] if s == 503),
                                             "%.3f / %.3f / %.3f" % (lo, me, hi),
                                             "%s / %s / %s" % (real(lo), real(me), real(hi))))

    # ---- the breaker
    log()
    ok_samples = [s for s in samples if "error" not in s]
    trip_rows, seen = [], set()
    for s in ok_samples:
        if s["opened_at"] is not None and s["opened_at"] not in seen:
            seen.add(s["opened_at"])
            trip_rows.append(s)
    max_trips = max([s["trips"] for s in ok_samples] or [0])
    states = {}
    for s in ok_samples:
        states[s["state"]] = states.get(s["state"], 0) + 1
    log("   breaker (endpoint_health sampled every 1 s, %d samples: %s); most trips seen %d; at the end %s"
        % (len(ok_samples), ", ".join("%s %d" % kv for kv in sorted(states.items())), max_trips,
           "state|trips|delivered|failed = " + health_end))
    if trip_rows:
        log("   openings seen by the samples (a cool-down shorter than the 1 s sampling can be missed):")
        log("   %-6s %12s %14s %10s   %10s %14s %10s" % ("trips", "opened_at s", "next_probe_at s", "cool-down",
                                                       "opened real", "probe real", "cool real"))
        for s in trip_rows:
            cd = s["next_probe_at"] - s["opened_at"]
            log("   %-6d %12.3f %14.3f %10.3f   %10s %14s %10s" % (s["trips"], s["opened_at"] - t0,
                                                               s["next_probe_at"] - t0, cd,
                                                               real(s["opened_at"] - t0), real(s["next_probe_at"] - t0),
                                                               real(cd)))
    fs = [s["failing_since"] for s in ok_samples if s["failing_since"] is not None]
    if fs:
        log("   failing_since t=%.3f s; longest failing stretch sampled %.1f s scaled (%s real) vs disable_after 5 days"
            " (2 h scaled): not reached" % (min(fs) - t0, max(s["t"] - s["failing_since"] for s in ok_samples
                                                          if s["failing_since"] is not None), real(
                max(s["t"] - s["failing_since"] for s in ok_samples if s["failing_since"] is not None))))

    # requests to the sink in time order; a probe is a request that went out alone while the breaker
    # was not closed: every request after the first claim's burst up to the first 200
    ordered = sorted((a["t"], m["id"], a["attempt"], a["status"]) for m in allm for a in m["arrivals"])
    if ordered and THRESHOLD > 0:
        first_ok = next((x for x in ordered if x[3] == 200), None)
        burst_end = ordered[0][0]
        for x in ordered:
            if x[0] - burst_end < 0.05:
                burst_end = x[0]
            else:
                break
        burst = [x for x in ordered if x[0] <= burst_end]
        probes = [x for x in ordered if burst_end < x[0] <= (first_ok[0] if first_ok else t_end - t0)]
        log("   first claim: %d requests at t=%.3f .. %.3f s (before the breaker opened), all 503"
            % (len(burst), burst[0][0], burst[-1][0]) if all(x[3] == 503 for x in burst) else
            "   first claim: %d requests at t=%.3f .. %.3f s" % (len(burst), burst[0][0], burst[-1][0]))
        log("   probes (every request after that, up to the first 200; one at a time):")
        log("   %-3s %11s %10s %8s %7s %6s %12s" % ("#", "t scaled s", "t real", "message", "attempt", "answer",
                                                   "gap scaled"))
        prev = burst[-1][0]
        for i, p in enumerate(probes, 1):
            log("   %-3d %11.3f %10s %8d %7d %6s %12.3f" % (i, p[0], real(p[0]), p[1], p[2], p[3], p[0] - prev))
            prev = p[0]
        if first_ok:
            after = [x for x in ordered if x[0] > first_ok[0]]
            log("   after the successful probe at t=%.3f s (%.3f s = %s real after the recovery): %d more requests,"
                " %d answered 200, from t=%.3f to %.3f s" % (
                    first_ok[0], first_ok[0] - rec, real(first_ok[0] - rec), len(after),
                    sum(1 for x in after if x[3] == 200), after[0][0] if after else 0, after[-1][0] if after else 0))
        # the same outage in real time: the cool-down 30 s doubling with the 1 h cap
        if burst:
            first_open = burst[0][0] * SCALE
            pr = real_probe_times(OUTAGE_REAL, 0.0)
            log("   real time, computed (not measured): cool-down %gs doubling, capped at 1 h, request times 0,"
                " the breaker opening at t=0:" % REAL_COOLDOWN_S)
            log("     probes at %s; the first after the %s outage at %s, i.e. %s after the recovery"
                % (", ".join(real(t / SCALE) for _, _, t in pr), real(OUTAGE), real(pr[-1][2] / SCALE),
                   real((pr[-1][2] - OUTAGE_REAL) / SCALE)))
            unc = 0.0
            k = 0
            while unc < OUTAGE_REAL:
                unc += REAL_COOLDOWN_S * 2 ** k
                k += 1
            log("     (this scaled run keeps doubling past the cap: its last cool-down corresponds to %s real,"
                " first probe after the recovery at %s real, %s after it; first opening measured at t=%.3f s scaled)"
                % (real(REAL_COOLDOWN_S * 2 ** (k - 1) / SCALE), real(unc / SCALE), real((unc - OUTAGE_REAL) / SCALE),
                   first_open / SCALE))
    elif ordered:
        log("   breaker_threshold 0: no breaker; every message follows the schedule on its own")
    log()
    log("   per message: %s/messages.tsv; everything: %s/result.json; sink log: %s/requests.jsonl"
        % (WORK, WORK, WORK))


if __name__ == "__main__":
    main()
