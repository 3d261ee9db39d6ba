#!/usr/bin/python3
"""
bench.py — every performance scenario of outbox_dispatcher, 3 runs each.

Run through `make bench` (test/bench/run_bench.sh), which installs what is
needed, builds and installs the extension and runs this script as the
postgres user in a scratch directory.  Prints one table (min / median / max
of the runs) and writes results.json, results.md and plot.png into OUT.

Scenarios (default settings unless the scenario is about a setting):
  fresh      drain 50,000 ~250-byte messages committed while the workers
             were paused; the workers prepared their plans on an empty table
             (20 single messages delivered first).  Its log also breaks the
             drain's WAL down by record type (pg_waldump --stats=record).
  backlog    the same with 100,000 messages.
  accrued    a backlog as it accrues while an endpoint is down: ACCRUE_S
             (20) seconds of ACCRUE_TPS (1,500) pgbench transactions of 10
             messages committed while the workers were paused (~300,000
             messages whose available_at spread over those seconds), then
             drained: msg/s and the workers' CPU per message.  (The backlog
             above is one INSERT: one available_at for all.)
  retained   the same 50,000 with 1,000,000 done rows retained (done within
             the retention window), VACUUM ANALYZE taken while no message was
             open (the statistics say the open set is empty); and beside it,
             in the same minute (the order alternating by run), the same
             drain on a fresh table, so that the ratio retained / fresh is
             taken while the machine runs at one speed.
  sustained  pgbench producer, 500 tx/s x 10 messages (5,000 msg/s),
             synchronous_commit = on for the producer: the application's
             transaction latency (avg, p99) with the workers delivering vs
             with the workers paused, in SUSTAIN_PAIRS alternating pairs of
             SUSTAIN_S-second phases (medians), the CPU the workers used
             (cores = CPU seconds / wall seconds), and the WAL flushes the
             producers' commits waited for (ms and kB per fsync: a commit
             flushes every WAL record before it, the workers' included),
             the workers' transactions per second (the pairs follow a
             discarded warm-up phase, see scenario_sustained), and the delivery
             latency under that load: each message's created_at (its
             producer transaction's start, so that transaction's own
             latency is included) to its arrival at nginx (access log,
             millisecond resolution), p50 / p99.
  idle       commit -> arrival at a recording sink, 200 single-message
             transactions 20 ms apart: p50 / p99.  The commit time is the
             producer transaction's commit timestamp (track_commit_timestamp:
             taken as its commit record is written, so its WAL flush counts);
             also from the start of its INSERT (created_at); then the same
             with the producer at synchronous_commit = off, where no WAL
             flush of its own separates its commit timestamp from its
             message becoming visible to the workers.  Arrival is read two
             ways from the same requests: the sink's clock once it has read
             the request head (its own wake-up and parsing included), and the
             kernel's receive time of the request's first bytes at the sink's
             socket (SO_TIMESTAMPNS, the same clock): the moment the request
             reached the endpoint, which is where the dispatcher's part ends.
  wal        for the fresh and retained drains: WAL bytes written during the
             drain (claim + finalize; a CHECKPOINT right before the messages
             were inserted, so full-page images of pages the drain touches
             first count), full-page images, and the share of HOT updates.
  replication  a synchronous standby on loopback (pg_basebackup of the
             primary, synchronous_standby_names = '*'): drain N_REPL
             (20,000) and idle commit -> arrival, with
             outbox_dispatcher.deliver_after_replication off, then on.
  scaling    fresh drain with workers 1/2/4 x batch_size 100/500 (the two
             batch sizes back to back, the order alternating by run; their
             ratio per run).  SCALE_WORKERS and SCALE_BATCHES (comma lists)
             measure other counts and sizes; the table shows 1/2/4 x 100/500.
  fanout     N_FANOUT (10,000) events, each in its own transaction from one
             pgbench client while the workers are paused: enqueue() of one
             message per event (the baseline), then outbox.publish() with 1
             and with 5 endpoints subscribed ({*}; the same nginx, paths
             /hook/1 .. /hook/5).  Per event: the transaction's latency (avg,
             p99), the growth of outbox.messages (pg_total_relation_size:
             heap, TOAST, indexes) and the WAL written (a CHECKPOINT right
             before); then the drain of every delivery (deliveries/s and
             events/s).  Each variant on its own cluster, the order rotated
             from run to run.
  attempt_log  fresh drain of N_ATTEMPT (50,000) messages with
             outbox_dispatcher.attempt_log = all, failures and off (every
             request answered 200, so 'failures' logs nothing), each on its
             own cluster (track_wal_io_timing on), the order rotated from run
             to run: msg/s, the workers' CPU per message (user + system: other
             work on the machine moves it less than msg/s), WAL bytes, records
             and fsync time per message, outbox.attempts bytes per message, and
             how much slower 'all' and 'failures' are than 'off' in the same
             run (drain rate and CPU per message).

Each run uses its own freshly initialised cluster (fsync on, the
extension's defaults); the HTTP endpoint is one nginx worker answering
`return 200` over keep-alive on loopback.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RUNS = int(os.environ.get("RUNS", "3"))
N_FRESH = int(os.environ.get("N", "50000"))
N_BACKLOG = int(os.environ.get("N_BACKLOG", "100000"))
N_RETAINED = int(os.environ.get("N_RETAINED", "1000000"))
SUSTAIN_S = int(os.environ.get("SUSTAIN_S", "10"))
SUSTAIN_PAIRS = int(os.environ.get("SUSTAIN_PAIRS", "3"))
SUSTAIN_TPS = int(os.environ.get("SUSTAIN_TPS", "500"))
IDLE_M = int(os.environ.get("IDLE_M", "200"))
N_REPL = int(os.environ.get("N_REPL", "20000"))
N_FANOUT = int(os.environ.get("N_FANOUT", "10000"))
N_ATTEMPT = int(os.environ.get("N_ATTEMPT", "50000"))
ACCRUE_TPS = int(os.environ.get("ACCRUE_TPS", "1500"))
ACCRUE_S = int(os.environ.get("ACCRUE_S", "20"))
# the scaling scenario's workers and batch sizes (the table and the plot show 1/2/4 x 100/500)
SCALE_WORKERS = tuple(int(x) for x in os.environ.get("SCALE_WORKERS", "1,2,4").split(","))
SCALE_BATCHES = tuple(int(x) for x in os.environ.get("SCALE_BATCHES", "100,500").split(","))
SCENARIOS = os.environ.get("SCENARIOS", "fresh,backlog,accrued,retained,sustained,idle,replication,scaling,"
                           "fanout,attempt_log").split(",")
WORK = os.environ.get("OD_BENCH_WORK") or tempfile.mkdtemp(prefix="od_bench.")
OUT = os.environ.get("OUT", os.path.join(WORK, "out"))
SRC = os.environ.get("OD_BENCH_SRC", os.path.dirname(os.path.abspath(__file__)) + "/../..")
PORT = int(os.environ.get("PORT", "55440"))
NGINX_PORT = int(os.environ.get("NGINX_PORT", "18191"))
PGBIN = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
# BENCH_CONF="name=value;name=value": settings for every cluster (to compare a setting with its
# default, e.g. BENCH_CONF="outbox_dispatcher.attempt_log=off"); a scenario's own settings win
BENCH_CONF = dict(kv.split("=", 1) for kv in os.environ.get("BENCH_CONF", "").split(";") if "=" in kv)
PAYLOAD = "jsonb_build_object('order_id', g, 'amount', g % 1000, 'note', repeat('x', 200))"


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- servers

class Cluster:
    """A throwaway PostgreSQL cluster with the extension preloaded."""

    def __init__(self, name, conf=None, template=None):
        self.dir = os.path.join(WORK, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        if template:
            subprocess.run(["cp", "-a", template, self.dir], check=True)
        else:
            subprocess.run([PGBIN + "/initdb", "-D", self.dir, "-A", "trust", "-U", "postgres"],
                           check=True, stdout=subprocess.DEVNULL)
            base = {
                "shared_preload_libraries": "'outbox_dispatcher'",
                "port": str(PORT),
                "listen_addresses": "''",
                "unix_socket_directories": "'%s'" % WORK,
                "max_wal_size": "'4GB'",
                "outbox_dispatcher.enabled": "off",
            }
            base.update(BENCH_CONF)
            base.update(conf or {})
            with open(os.path.join(self.dir, "postgresql.conf"), "a") as f:
                for k, v in base.items():
                    f.write("%s = %s\n" % (k, v))
        self.start()

    def start(self):
        subprocess.run([PGBIN + "/pg_ctl", "-D", self.dir, "-l", self.dir + ".log", "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self, mode="fast"):
        subprocess.run([PGBIN + "/pg_ctl", "-D", self.dir, "-m", mode, "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def sql(self, *stmts):
        args = [PGBIN + "/psql", "-h", WORK, "-p", str(PORT), "-U", "postgres", "-d", "postgres",
                "-XAtq", "-v", "ON_ERROR_STOP=1"]
        for s in stmts:
            args += ["-c", s]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("psql failed: %s\n%s" % (stmts, r.stderr))
        return r.stdout.strip()

    def set_enabled(self, on):
        self.sql("ALTER SYSTEM SET outbox_dispatcher.enabled = %s" % ("on" if on else "off"),
                 "SELECT pg_reload_conf()")
        # wait until every worker acknowledged the reload
        want = "t" if on else "f"
        for _ in range(400):
            states = self.sql("SELECT string_agg(state, ',') FROM outbox.worker_stats")
            if on and "paused" not in states:
                return
            if not on and all(s in ("paused",) for s in states.split(",") if s):
                return
            time.sleep(0.025)
        raise RuntimeError("workers did not switch to enabled=%s (%s)" % (want, states))

    def worker_pids(self):
        out = self.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_dispatcher worker'")
        return [int(p) for p in out.split()] if out else []


def load_average():
    """The machine's 1-minute load average (other work on the machine shows in it)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_seconds(pids):
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / hz


ARRIVAL_LOG = os.path.join(WORK, "nginx", "logs", "arrival.log")


def start_nginx():
    d = os.path.join(WORK, "nginx")
    os.makedirs(d + "/logs", exist_ok=True)
    conf = os.path.join(WORK, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    log_format arrival '$msec $http_idempotency_key';
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path %(d)s/body;
    proxy_temp_path %(d)s/proxy;
    fastcgi_temp_path %(d)s/fastcgi;
    uwsgi_temp_path %(d)s/uwsgi;
    scgi_temp_path %(d)s/scgi;
    server {
        listen 127.0.0.1:%(p)d;
        location / { return 200 "ok"; }
        # arrival times (ms) by Idempotency-Key, for the delivery latency under load
        location /logged { access_log %(log)s arrival buffer=64k flush=1s; return 200 "ok"; }
    }
}
""" % {"d": d, "p": NGINX_PORT, "log": ARRIVAL_LOG})
    subprocess.run(["nginx", "-c", conf, "-p", d, "-e", d + "/logs/error.log"], check=True)
    return d + "/nginx.pid"


def start_sink():
    pf = os.path.join(WORK, "sink.port")
    proc = subprocess.Popen(["/usr/bin/python3", os.path.join(SRC, "test/sink/sink.py"), "--port", "0",
                             "--port-file", pf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(pf) and open(pf).read().strip():
            return proc, int(open(pf).read().strip())
        time.sleep(0.1)
    raise RuntimeError("sink did not start")


# ---------------------------------------------------------------- scenario parts

def new_dispatcher(name, workers=None, batch=None, template=None, extra=None):
    conf = {}
    if workers is not None:
        conf["outbox_dispatcher.workers"] = str(workers)
    if batch is not None:
        conf["outbox_dispatcher.batch_size"] = str(batch)
    conf.update(extra or {})
    c = Cluster(name, conf, template)
    if template is None:
        c.sql("CREATE EXTENSION outbox_dispatcher",
              "INSERT INTO outbox.endpoints (name, url) VALUES ('nginx', 'http://127.0.0.1:%d/hook')" % NGINX_PORT)
    return c


def warm_plans(c, count=20):
    """Deliver `count` single messages so that every worker statement is
    prepared (and the plan cache has decided) on the table as it is now."""
    c.set_enabled(True)
    for i in range(count):
        c.sql("INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
              " VALUES ('warm', '%d', 'Warm', '{}', 'nginx')" % i)
        time.sleep(0.01)
    wait_drained(c, timeout=30)
    c.set_enabled(False)


def wait_drained(c, timeout=600):
    """Until nothing is pending or processing.  One psql session, asked every 50 ms: a new psql
    process and backend per look (a fork, a connection, a catalog cache warmed up) cost the machine
    about a tenth of its CPU while a drain was running, taken from the drain it measured.  Drains
    are timed by done_at, not by when this notices the end.  The look is drained.sql (index
    scans only; why there)."""
    deadline = time.time() + timeout
    with open(os.path.join(SRC, "test/bench/drained.sql")) as f:
        q = f.read()
    p = subprocess.Popen([PGBIN + "/psql", "-h", WORK, "-p", str(PORT), "-U", "postgres", "-d", "postgres",
                          "-XAtq", "-v", "ON_ERROR_STOP=1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, bufsize=1)
    try:
        while time.time() < deadline:
            p.stdin.write(q)
            p.stdin.flush()
            left = p.stdout.readline().strip()
            if left == "0":
                return
            if left != "1":
                raise RuntimeError("psql failed while waiting for the drain: %r" % left)
            time.sleep(0.05)
    finally:
        p.stdin.close()
        p.wait()
    raise RuntimeError("not drained after %d s" % timeout)


def calibration_seconds():
    """CPU seconds of a fixed single-threaded loop: how fast this machine is right now.  The
    same code took from 37 to 22 us of CPU per HTTP request on this 2-core machine within one
    evening (other tenants share its cores and caches), so a figure is comparable with another
    only next to this one."""
    t0 = time.process_time()
    x = 0
    for i in range(3000000):
        x = (x * 31 + i) & 0xFFFFFFFF
    return time.process_time() - t0


def flush_ms():
    """Median time of one 8 kB write + fdatasync in the clusters' directory, of 100: how fast this
    machine's disk flushes right now.  The speed row above counts CPU only; a commit waits for
    this (the producers' and the idle scenario's), and it drifts on its own."""
    path = os.path.join(WORK, "flush_probe")
    block = b"\0" * 8192
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(100):
            t0 = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return 1000.0 * p50(times)


def table_counters(c):
    r = c.sql("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'outbox.messages'::regclass")
    upd, hot = (int(x) for x in r.split("|"))
    return upd, hot


def wal_counters(c):
    r = c.sql("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, wal_fpi, wal_records FROM pg_stat_wal")
    b, fpi, rec = r.split("|")
    return int(float(b)), int(fpi), int(rec)


def wal_by_type(c, start_b, end_b, n):
    """The WAL between two insert positions (bytes from 0/0) by record type, per message n:
    {type: (records, bytes)} from pg_waldump --stats=record (full-page images included in the
    bytes); {} if the segments are gone (a checkpoint recycled them)."""
    lsn = lambda b: "%X/%X" % (b >> 32, b & 0xFFFFFFFF)
    p = subprocess.run([PGBIN + "/pg_waldump", "-p", os.path.join(c.dir, "pg_wal"), "-s", lsn(start_b),
                        "-e", lsn(end_b), "--stats=record"], capture_output=True, text=True)
    out = {}
    # type, records (%), record bytes (%), full-page image bytes (%), combined bytes (%)
    row = re.compile(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+\d+\s+\(\s*[\d.]+\)\s+\d+\s+\(\s*[\d.]+\)\s+(\d+)")
    for line in p.stdout.splitlines():
        m = row.match(line)
        if m:
            out[m.group(1)] = (int(m.group(2)) / n, int(m.group(3)) / n)
    return out


def log_wal_by_type(label, types):
    """One line per record type that is at least 1 % of the bytes, largest first."""
    total = sum(b for _, b in types.values())
    if not total:
        return
    log("  %-10s WAL by record type, per delivered message (pg_waldump --stats=record):" % label)
    for name, (recs, b) in sorted(types.items(), key=lambda kv: -kv[1][1]):
        if b >= 0.01 * total:
            log("             %-22s %5.2f records %5.0f B (%4.1f %%)" % (name, recs, b, 100.0 * b / total))


def attempt_counters(c):
    """(rows, bytes) of outbox.attempts: every partition with its indexes."""
    r = c.sql("SELECT (SELECT count(*) FROM outbox.attempts),"
              "       (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox.attempts'))")
    rows, size = r.split("|")
    return int(rows), int(size or 0)


def insert_messages(c, n):
    """n messages to 'nginx' in one INSERT."""
    c.sql("INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
          " SELECT 'order', g::text, 'OrderCreated', %s, 'nginx' FROM generate_series(1, %d) g" % (PAYLOAD, n))
    return {"rows": n}


def drain(c, n, label, produce=None, by_type=False):
    """Fill the table while paused (after a CHECKPOINT), enable, time the drain.  The table gets n
    messages in one INSERT, or what produce(c) commits: it returns a dict whose "rows" is the number
    of messages to deliver, merged into the result.  Figures are per delivered message.  by_type:
    also the drain's WAL by record type (logged, and in the result as "wal_by_type")."""
    c.sql("CHECKPOINT")
    w0 = wal_counters(c)
    made = produce(c) if produce else insert_messages(c, n)
    n = made["rows"]
    w1 = wal_counters(c)
    time.sleep(0.6)                     # let the inserting backend's statistics reach the stats system
    u0 = table_counters(c)
    a0 = attempt_counters(c)
    pids = c.worker_pids()
    cpu0 = cpu_seconds(pids)
    f0 = wal_flushes(c)
    t0 = float(c.sql("SELECT extract(epoch FROM clock_timestamp())"))
    c.set_enabled(True)
    wait_drained(c)
    cpu1 = cpu_seconds(pids)
    f1 = wal_flushes(c)
    w2 = wal_counters(c)
    t1 = float(c.sql("SELECT extract(epoch FROM max(done_at)) FROM outbox.messages WHERE status = 'done'"))
    done = int(c.sql("SELECT count(*) FROM outbox.messages WHERE status = 'done' AND aggregate_type = 'order'"))
    time.sleep(1.2)                     # workers report their statistics when they go idle
    u1 = table_counters(c)
    a1 = attempt_counters(c)
    c.set_enabled(False)
    upd = u1[0] - u0[0]
    hot = u1[1] - u0[1]
    res = dict(made)
    res.update({
        "msg_s": n / (t1 - t0),
        "seconds": t1 - t0,
        "done": done,
        "insert_wal_b": (w1[0] - w0[0]) / n,
        "drain_wal_b": (w2[0] - w1[0]) / n,
        "drain_fpi": (w2[1] - w1[1]) / n,
        "drain_wal_records": (w2[2] - w1[2]) / n,
        "updates_per_msg": upd / n,
        "hot_pct": 100.0 * hot / upd if upd else 0.0,
        "attempt_rows_per_msg": (a1[0] - a0[0]) / n,
        "attempt_bytes_per_msg": (a1[1] - a0[1]) / n,
        # the workers' CPU (user + system), which other work on the machine changes less than msg/s
        "worker_cpu_us": (cpu1 - cpu0) * 1e6 / n,
        # WAL fsyncs of the drain (the workers' commits) and their time (track_wal_io_timing, else 0)
        "wal_syncs_per_msg": (f1[1] - f0[1]) / n,
        "wal_sync_us": (f1[2] - f0[2]) * 1000.0 / n,
    })
    log("  %-10s %8.0f msg/s  WAL %5.0f B/msg (fpi %.3f/msg, %.1f records)  updates %.2f/msg, HOT %.0f%%,"
        " worker CPU %.0f us/msg"
        % (label, res["msg_s"], res["drain_wal_b"], res["drain_fpi"], res["drain_wal_records"],
           res["updates_per_msg"], res["hot_pct"], res["worker_cpu_us"]))
    if by_type:
        res["wal_by_type"] = wal_by_type(c, w1[0], w2[0], n)
        log_wal_by_type(label, res["wal_by_type"])
    if done != n:
        raise RuntimeError("%s: %d of %d done" % (label, done, n))
    return res


# the producer of the sustained and accrued scenarios: one transaction of 10 messages to nginx
PRODUCER_SCRIPT = ("BEGIN;\n"
                   "INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
                   " SELECT 'order', (random() * 1000000)::int::text, 'OrderCreated', %s, 'nginx'"
                   " FROM generate_series(1, 10) g;\n"
                   "END;\n" % PAYLOAD)


def scenario_accrued():
    """A backlog as it accrues while an endpoint is down: ACCRUE_S seconds of ACCRUE_TPS producer
    transactions of 10 messages (pgbench), committed while the workers are paused, then drained.
    Unlike the backlog of one INSERT, its available_at values spread over those seconds."""
    def accrue(c):
        shutil.rmtree(pgbench(PRODUCER_SCRIPT, "-c", "4", "-j", "2", "-R", str(ACCRUE_TPS), "-T", str(ACCRUE_S)),
                      ignore_errors=True)
        return {"rows": int(c.sql("SELECT count(*) FROM outbox.messages WHERE status = 'pending'"))}

    c = new_dispatcher("accrued")
    try:
        warm_plans(c)
        return drain(c, 0, "accrued", produce=accrue)
    finally:
        c.destroy()


def scenario_drain(n, label, workers=None, batch=None, extra=None, by_type=False):
    c = new_dispatcher("drain", workers, batch, extra=extra)
    try:
        warm_plans(c)
        return drain(c, n, label, by_type=by_type)
    finally:
        c.destroy()


RETAINED_TEMPLATE = None


def retained_template():
    """One cluster with N_RETAINED done rows, analyzed with nothing open, kept as a template."""
    global RETAINED_TEMPLATE
    if RETAINED_TEMPLATE:
        return RETAINED_TEMPLATE
    c = new_dispatcher("retained_tpl")
    warm_plans(c)
    log("  building %d retained done rows ..." % N_RETAINED)
    c.sql("INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
          " SELECT 'history', g::text, 'OrderCreated', %s, 'nginx' FROM generate_series(1, %d) g"
          % (PAYLOAD, N_RETAINED))
    # delivered over the last 6 days (inside the default 7-day retention)
    c.sql("ALTER TABLE outbox.messages DISABLE TRIGGER USER",
          "UPDATE outbox.messages SET status = 'done', attempts = 1, lease_version = 1,"
          " done_at = now() - (id % 518400) * interval '1 second' WHERE aggregate_type = 'history'",
          "ALTER TABLE outbox.messages ENABLE TRIGGER USER")
    c.sql("VACUUM FULL outbox.messages")
    c.sql("VACUUM ANALYZE outbox.messages")
    c.stop()
    RETAINED_TEMPLATE = c.dir + "_template"
    shutil.rmtree(RETAINED_TEMPLATE, ignore_errors=True)
    os.rename(c.dir, RETAINED_TEMPLATE)
    return RETAINED_TEMPLATE


def scenario_retained():
    tpl = retained_template()
    c = new_dispatcher("retained", template=tpl)
    try:
        warm_plans(c)
        # the statistics are those of a queue with nothing open, as after a quiet night
        c.sql("VACUUM ANALYZE outbox.messages")
        return drain(c, N_FRESH, "retained")
    finally:
        c.destroy()


def wal_flushes(c):
    """(WAL bytes, WAL syncs, ms spent in them) so far, cluster-wide: pg_stat_wal up to
    PostgreSQL 17, pg_stat_io's wal rows from 18 on (track_wal_io_timing for the time)."""
    r = c.sql("SELECT wal_bytes, wal_sync, wal_sync_time FROM pg_stat_wal"
              if int(c.sql("SHOW server_version_num")) < 180000 else
              "SELECT (SELECT wal_bytes FROM pg_stat_wal), sum(fsyncs), sum(fsync_time)"
              "  FROM pg_stat_io WHERE object = 'wal'")
    return [float(x or 0) for x in r.split("|")]


def pgbench(script, *args):
    """Run pgbench with the script (text) and args on the cluster, logging every transaction;
    returns the log directory (for tx_latencies)."""
    logdir = tempfile.mkdtemp(dir=WORK, prefix="pgbench.")
    path = os.path.join(logdir, "script.sql")
    with open(path, "w") as f:
        f.write(script)
    subprocess.run([PGBIN + "/pgbench", "-h", WORK, "-p", str(PORT), "-U", "postgres", "-n", "-f", path]
                   + list(args) + ["-l", "--log-prefix", logdir + "/tx", "postgres"],
                   check=True, capture_output=True, cwd=logdir)
    return logdir


def tx_latencies(logdir):
    """The transaction latencies (ms, sorted) of a pgbench log directory, which it removes."""
    lat = []
    for fn in os.listdir(logdir):
        if not fn.startswith("tx"):
            continue
        with open(os.path.join(logdir, fn)) as f:
            for line in f:
                parts = line.split()
                # client tx time_us script epoch epoch_us [lag_us]: time_us includes the schedule lag
                lat.append(int(parts[2]) / 1000.0)
    shutil.rmtree(logdir)
    lat.sort()
    return lat


def p50(sorted_values):
    return sorted_values[len(sorted_values) // 2]


def p99(sorted_values):
    return sorted_values[min(len(sorted_values) - 1, int(0.99 * len(sorted_values)))]


def pgbench_run(c, seconds, tps):
    pids = c.worker_pids()
    commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    cpu0 = cpu_seconds(pids)
    wal0 = wal_flushes(c)
    xact0 = int(c.sql(commits))
    t0 = time.time()
    logdir = pgbench(PRODUCER_SCRIPT, "-c", "8", "-j", "2", "-R", str(tps), "-T", str(seconds))
    wall = time.time() - t0
    cpu = cpu_seconds(pids) - cpu0
    wal_bytes, syncs, sync_ms = (b - a for a, b in zip(wal0, wal_flushes(c)))
    lat = tx_latencies(logdir)
    time.sleep(1.1)  # the workers report their counters to the statistics within a second
    xact = int(c.sql(commits)) - xact0 - len(lat)  # the workers' (and a few of ours)
    return {
        "worker_tx_per_s": xact / wall,
        "avg_ms": sum(lat) / len(lat),
        "p99_ms": p99(lat),
        "tps": len(lat) / seconds,
        "worker_cores": cpu / wall,
        # the producers' commits flush whatever WAL precedes them, the workers' included
        "sync_ms": sync_ms / max(syncs, 1),
        "kb_per_sync": wal_bytes / 1024.0 / max(syncs, 1),
    }


def delivery_latency(c):
    """created_at (the producer transaction's start: its own latency is included) -> arrival at
    nginx (its access log, millisecond resolution) of the messages of the last delivering phase."""
    time.sleep(1.5)  # the access log's buffer is flushed every second
    arrived = {}
    with open(ARRIVAL_LOG) as f:
        for line in f:
            t, _, key = line.strip().partition(" ")
            if key and key != "-":
                arrived.setdefault(key, float(t))  # the first arrival of each message
    lat = []
    for line in c.sql("SELECT id, extract(epoch FROM created_at) FROM outbox.messages").splitlines():
        i, ts = line.split("|")
        if i in arrived:
            lat.append((arrived[i] - float(ts)) * 1000.0)
    lat.sort()
    if not lat:
        raise RuntimeError("no arrival in the nginx access log")
    return {"delivery_p50_ms": p50(lat), "delivery_p99_ms": p99(lat)}


def scenario_sustained():
    """
    SUSTAIN_PAIRS pairs of (paused, delivering) producer phases of SUSTAIN_S
    seconds each, alternating in one cluster, so that this machine's drift
    (its paused latency alone varies 2x between minutes) falls on both
    sides: each pair gives a ratio, the run reports the medians.  Each phase
    starts from an empty, vacuumed table; a delivering phase ends once the
    backlog it left is drained.  The pairs follow a warm-up: the files the
    earlier scenarios left (the retained one's million rows) are written
    back first (sync), then one delivering phase is run and discarded.
    Without it the first paused phase waited for that write-back and the
    first pair's ratio came out at 0.50, 0.73 and 1.03 in the three runs of
    a full `make bench` (the other pairs 1.56-1.76): a bias in the
    dispatcher's favour that the median of three halved but did not remove.
    """
    c = new_dispatcher("sustained", extra={"track_wal_io_timing": "on"})
    try:
        warm_plans(c)
        c.sql("UPDATE outbox.endpoints SET url = 'http://127.0.0.1:%d/logged' WHERE name = 'nginx'" % NGINX_PORT)
        os.sync()
        c.set_enabled(True)
        pgbench_run(c, SUSTAIN_S, SUSTAIN_TPS)
        wait_drained(c)
        ons, offs = [], []
        for _ in range(SUSTAIN_PAIRS):
            for enabled in (False, True):
                c.set_enabled(False)
                c.sql("TRUNCATE outbox.messages")
                c.sql("VACUUM ANALYZE outbox.messages")
                open(ARRIVAL_LOG, "w").close()  # nginx appends (O_APPEND): this phase's arrivals only
                c.set_enabled(enabled)
                r = pgbench_run(c, SUSTAIN_S, SUSTAIN_TPS)
                if enabled:
                    wait_drained(c)
                    r.update(delivery_latency(c))
                    ons.append(r)
                else:
                    offs.append(r)
        med = lambda rs, k: statistics.median(x[k] for x in rs)
        res = {"on_avg_ms": med(ons, "avg_ms"), "on_p99_ms": med(ons, "p99_ms"),
               "off_avg_ms": med(offs, "avg_ms"), "off_p99_ms": med(offs, "p99_ms"),
               "worker_cores": med(ons, "worker_cores"),
               "ratio_avg": statistics.median(a["avg_ms"] / b["avg_ms"] for a, b in zip(ons, offs)),
               "ratio_p99": statistics.median(a["p99_ms"] / b["p99_ms"] for a, b in zip(ons, offs)),
               "tps_on": med(ons, "tps"),
               "on_sync_ms": med(ons, "sync_ms"), "off_sync_ms": med(offs, "sync_ms"),
               "on_kb_per_sync": med(ons, "kb_per_sync"), "off_kb_per_sync": med(offs, "kb_per_sync"),
               "delivery_p50_ms": med(ons, "delivery_p50_ms"), "delivery_p99_ms": med(ons, "delivery_p99_ms"),
               "worker_tx_per_s": med(ons, "worker_tx_per_s")}
        log("  sustained  app latency avg %.2f / p99 %.2f ms with workers, %.2f / %.2f ms paused (x%.2f avg,"
            " median of %d alternating pairs: %s); workers %.2f cores"
            % (res["on_avg_ms"], res["on_p99_ms"], res["off_avg_ms"], res["off_p99_ms"], res["ratio_avg"],
               len(ons), " ".join("%.2f" % (a["avg_ms"] / b["avg_ms"]) for a, b in zip(ons, offs)),
               res["worker_cores"]))
        log("             WAL flushes: %.2f ms / %.1f kB each with workers, %.2f ms / %.1f kB paused"
            % (res["on_sync_ms"], res["on_kb_per_sync"], res["off_sync_ms"], res["off_kb_per_sync"]))
        log("             delivery (producer statement start -> arrival at nginx) p50 %.1f / p99 %.1f ms;"
            " worker transactions %.0f/s" % (res["delivery_p50_ms"], res["delivery_p99_ms"], res["worker_tx_per_s"]))
        return res
    finally:
        c.destroy()


def scenario_idle(sink_port):
    c = new_dispatcher("idle", extra={"track_commit_timestamp": "on"})
    try:
        c.sql("INSERT INTO outbox.endpoints (name, url) VALUES ('sink', 'http://127.0.0.1:%d/hook')" % sink_port)
        res = idle_latency(c, sink_port, "idle")
        noflush = idle_latency(c, sink_port, "idle (producer without WAL flush)", flush=False)
        res["noflush_p50_ms"], res["noflush_p99_ms"] = noflush["p50_ms"], noflush["p99_ms"]
        for k in ("rx_p50_ms", "to_start_p50_ms", "to_rx_p50_ms"):
            res["noflush_" + k] = noflush[k]
        return res
    finally:
        c.destroy()


class Libpq:
    """One libpq connection through ctypes (the bench needs no Python driver): the idle scenario's
    producer, so that the moment each COMMIT is acknowledged is read on the client, next to the
    sink's arrival clock (the same machine's time.time())."""

    def __init__(self, conninfo):
        import ctypes
        import ctypes.util
        lib = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")
        lib.PQconnectdb.restype, lib.PQconnectdb.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
        lib.PQstatus.restype, lib.PQstatus.argtypes = ctypes.c_int, [ctypes.c_void_p]
        lib.PQerrorMessage.restype, lib.PQerrorMessage.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        lib.PQexec.restype, lib.PQexec.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
        lib.PQresultStatus.restype, lib.PQresultStatus.argtypes = ctypes.c_int, [ctypes.c_void_p]
        lib.PQresultErrorMessage.restype, lib.PQresultErrorMessage.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        lib.PQclear.restype, lib.PQclear.argtypes = None, [ctypes.c_void_p]
        lib.PQfinish.restype, lib.PQfinish.argtypes = None, [ctypes.c_void_p]
        self.lib = lib
        self.conn = lib.PQconnectdb(conninfo.encode())
        if lib.PQstatus(self.conn) != 0:                      # CONNECTION_OK
            msg = lib.PQerrorMessage(self.conn).decode(errors="replace")
            lib.PQfinish(self.conn)
            raise RuntimeError("libpq: " + msg)

    def execute(self, sql):
        """Runs sql (one or more statements, one round trip); returns when the server has answered."""
        res = self.lib.PQexec(self.conn, sql.encode())
        st = self.lib.PQresultStatus(res) if res else -1
        err = self.lib.PQresultErrorMessage(res).decode(errors="replace") if res else "out of memory"
        self.lib.PQclear(res)
        if st not in (1, 2):                                  # PGRES_COMMAND_OK, PGRES_TUPLES_OK
            raise RuntimeError("libpq: " + (err or self.lib.PQerrorMessage(self.conn).decode(errors="replace")))

    def close(self):
        self.lib.PQfinish(self.conn)


def idle_latency(c, sink_port, label, flush=True):
    """Commit -> arrival of IDLE_M single messages to the sink (endpoint 'sink'), on cluster c.
    flush=False: the producer commits with synchronous_commit = off, so that no WAL flush of its
    own lies between its commit timestamp and the moment its message becomes visible (what is
    left is the dispatcher's: wake, claim, send, and the sink)."""
    # the commit time of each producer transaction, by its xid (the message row's own xmin
    # is replaced by the workers' updates)
    c.sql("DROP TABLE IF EXISTS bench_tx", "DELETE FROM outbox.messages",
          "CREATE TABLE bench_tx (aggregate_id text PRIMARY KEY, xid xid8 NOT NULL)")
    c.set_enabled(True)
    urllib.request.urlopen("http://127.0.0.1:%d/_control/reset" % sink_port, data=b"").read()
    time.sleep(1.5)
    # one transaction per message, 20 ms apart, each sent as one query string; acked[i]: when
    # the client had the answer to its COMMIT (the application's "committed")
    acked = {}
    pq = Libpq("host=%s port=%d user=postgres dbname=postgres" % (WORK, PORT))
    try:
        for i in range(IDLE_M):
            pq.execute("BEGIN;" + ("" if flush else " SET LOCAL synchronous_commit = off;") +
                       " INSERT INTO outbox.messages (aggregate_type, aggregate_id, event_type, payload, endpoint)"
                       " VALUES ('order', '%d', 'OrderCreated', '{\"n\": %d}', 'sink');"
                       " INSERT INTO bench_tx VALUES ('%d', pg_current_xact_id()); COMMIT;" % (i, i, i))
            acked[str(i)] = time.time()
            time.sleep(0.02)
    finally:
        pq.close()
    wait_drained(c)
    reqs = json.load(urllib.request.urlopen("http://127.0.0.1:%d/_control/requests?path=/hook" % sink_port))
    committed, created, ack, started = {}, {}, {}, {}
    # started: when the worker submitted the request (the attempt log's started_at, its clock)
    for line in c.sql("SELECT m.id, extract(epoch FROM pg_xact_commit_timestamp(xid(t.xid))),"
                      "       extract(epoch FROM m.created_at), t.aggregate_id,"
                      "       (SELECT extract(epoch FROM a.started_at) FROM outbox.attempts AS a"
                      "         WHERE a.message_id = m.id AND a.attempt = 1)"
                      "  FROM outbox.messages AS m JOIN bench_tx AS t USING (aggregate_id)").splitlines():
        i, tc, ts, agg, st = line.split("|")
        committed[i], created[i], ack[i] = float(tc), float(ts), acked[agg]
        if st:
            started[i] = float(st)
    arrived = [(r["headers_lc"]["idempotency-key"], r["t"]) for r in reqs
               if r["headers_lc"].get("idempotency-key") in committed]
    lat = sorted((t - committed[k]) * 1000.0 for k, t in arrived)
    # the same requests by the kernel's receive time at the sink's socket (t_rx: null where
    # the platform does not give it), and the sink's own time from there to its clock
    stamped = [(r["headers_lc"]["idempotency-key"], r["t_rx"], r["t"]) for r in reqs
               if r["headers_lc"].get("idempotency-key") in committed and r.get("t_rx") is not None]
    if not stamped:
        raise RuntimeError("the sink gave no kernel receive times (SO_TIMESTAMPNS)")
    rx = sorted((t - committed[k]) * 1000.0 for k, t, _ in stamped)
    sink_own = sorted((t - t_rx) * 1000.0 for _, t_rx, t in stamped)
    # the dispatcher's part in two: commit -> the worker submits the request (wake, claim),
    # submitted -> received at the sink's socket (the request written, loopback TCP)
    to_start = sorted((started[k] - committed[k]) * 1000.0 for k, _, _ in stamped if k in started)
    to_rx = sorted((t - started[k]) * 1000.0 for k, t, _ in stamped if k in started)
    if not to_start:
        raise RuntimeError("no attempt-log rows for the idle messages (attempt_log = off?)")
    from_start = sorted((t - created[k]) * 1000.0 for k, t in arrived)
    # negative when the message arrived before the producer had read its COMMIT's answer
    from_ack = sorted((t - ack[k]) * 1000.0 for k, t in arrived)
    res = {"p50_ms": p50(lat), "p99_ms": p99(lat),
           "start_p50_ms": p50(from_start),
           "ack_p50_ms": p50(from_ack), "ack_p99_ms": p99(from_ack), "n": len(lat),
           "rx_p50_ms": p50(rx), "rx_p99_ms": p99(rx), "sink_own_p50_ms": p50(sink_own),
           "to_start_p50_ms": p50(to_start), "to_rx_p50_ms": p50(to_rx)}
    log("  %-10s commit -> arrival p50 %.2f ms, p99 %.2f ms (%d messages); from the producer's"
        " statement start (its own commit and WAL flush included) p50 %.2f ms; from the moment"
        " the producer had its COMMIT acknowledged p50 %.2f ms, p99 %.2f ms; commit -> received"
        " at the sink's socket p50 %.2f ms, p99 %.2f ms (%d stamped; the sink's own wake-up and"
        " parsing after that p50 %.2f ms); commit -> request submitted by the worker p50 %.2f ms,"
        " submitted -> received p50 %.2f ms"
        % (label, res["p50_ms"], res["p99_ms"], res["n"], res["start_p50_ms"], res["ack_p50_ms"],
           res["ack_p99_ms"], res["rx_p50_ms"], res["rx_p99_ms"], len(rx), res["sink_own_p50_ms"],
           res["to_start_p50_ms"], res["to_rx_p50_ms"]))
    c.set_enabled(False)
    return res


def scenario_replication(sink_port):
    """A synchronous standby on loopback (synchronous_standby_names = '*'): drain and idle latency
    with outbox_dispatcher.deliver_after_replication off, then on, on the same pair."""
    c = new_dispatcher("repl_primary", extra={"track_commit_timestamp": "on"})
    sdir = os.path.join(WORK, "repl_standby")
    shutil.rmtree(sdir, ignore_errors=True)
    res = {}
    try:
        subprocess.run([PGBIN + "/pg_basebackup", "-h", WORK, "-p", str(PORT), "-U", "postgres", "-D", sdir,
                        "-R", "-X", "stream"], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(sdir, "postgresql.conf"), "a") as f:
            f.write("port = %d\nsynchronous_standby_names = ''\n" % (PORT + 1))
        subprocess.run([PGBIN + "/pg_ctl", "-D", sdir, "-l", sdir + ".log", "-w", "start"],
                       check=True, stdout=subprocess.DEVNULL)
        c.sql("ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()")
        for _ in range(200):
            if c.sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == "1":
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the standby did not become synchronous")
        c.sql("INSERT INTO outbox.endpoints (name, url) VALUES ('sink', 'http://127.0.0.1:%d/hook')" % sink_port)
        warm_plans(c)
        for mode in ("off", "on"):
            c.sql("ALTER SYSTEM SET outbox_dispatcher.deliver_after_replication = %s" % mode, "SELECT pg_reload_conf()")
            c.sql("DELETE FROM outbox.messages")
            time.sleep(0.5)
            res["drain_%s_msg_s" % mode] = drain(c, N_REPL, "sync %s" % mode)["msg_s"]
            r = idle_latency(c, sink_port, "sync %s" % mode)
            res["idle_%s_p50_ms" % mode] = r["p50_ms"]
            res["idle_%s_p99_ms" % mode] = r["p99_ms"]
        return res
    finally:
        subprocess.run([PGBIN + "/pg_ctl", "-D", sdir, "-m", "immediate", "-w", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(sdir, ignore_errors=True)
        c.destroy()


# ---------------------------------------------------------------- fan-out and attempt log

# (variant, endpoints subscribed): 0 = enqueue() of one message per event to 'nginx'
FANOUT_VARIANTS = (("enqueue", 0), ("pub1", 1), ("pub5", 5))
ATTEMPT_LOG_MODES = ("all", "failures", "off")


def rotated(seq, k):
    """seq starting at its k-th element (mod its length): run k's order of the variants."""
    k %= len(seq)
    return tuple(seq[k:]) + tuple(seq[:k])


def publish_events(c, n, call):
    """n transactions of one event each (`SELECT call`, the event's g drawn at random and the
    payload PAYLOAD) from one pgbench client: the transactions' latency, and per event the
    growth of outbox.messages (heap, TOAST, indexes) and the WAL written."""
    size = "SELECT pg_total_relation_size('outbox.messages')"
    vacuums = ("SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables"
               " WHERE relid = 'outbox.messages'::regclass")
    s0, v0, w0 = int(c.sql(size)), int(c.sql(vacuums)), wal_counters(c)
    logdir = pgbench("\\set g random(1, 1000000)\nSELECT %s FROM (SELECT :g AS g) AS v;\n" % call,
                     "-c", "1", "-t", str(n))
    w1, s1 = wal_counters(c), int(c.sql(size))
    lat = tx_latencies(logdir)
    time.sleep(0.6)                     # statistics of autovacuum, if it came
    return {
        "rows": int(c.sql("SELECT count(*) FROM outbox.messages WHERE status = 'pending'")),
        "pub_avg_ms": sum(lat) / len(lat),
        "pub_p99_ms": p99(lat),
        "table_b_per_event": (s1 - s0) / n,
        "wal_b_per_event": (w1[0] - w0[0]) / n,
        "autovacuums": int(c.sql(vacuums)) - v0,
    }


def scenario_fanout(variant, subscribers, n=None):
    """n events (N_FANOUT) published while the workers are paused, then drained: with
    `subscribers` endpoints subscribed to every event (outbox.publish()), or with 0 enqueue()
    of one message per event (the baseline)."""
    n = n or N_FANOUT
    c = new_dispatcher("fanout")
    try:
        for i in range(1, subscribers + 1):
            c.sql("INSERT INTO outbox.endpoints (name, url) VALUES ('fan%d', 'http://127.0.0.1:%d/hook/%d')"
                  % (i, NGINX_PORT, i),
                  "INSERT INTO outbox.subscriptions (endpoint, event_types) VALUES ('fan%d', '{*}')" % i)
        if subscribers:
            call = "outbox.publish('order', g::text, 'OrderCreated', %s)" % PAYLOAD
        else:
            call = "outbox.enqueue('order', g::text, 'OrderCreated', %s, 'nginx')" % PAYLOAD
        warm_plans(c)
        r = drain(c, n, "%s x%d" % (variant, max(subscribers, 1)), produce=lambda c: publish_events(c, n, call))
        if r["rows"] != n * max(subscribers, 1):
            raise RuntimeError("%s: %d deliveries for %d events" % (variant, r["rows"], n))
        r["events_s"] = n / r["seconds"]
        log("  %-10s publish avg %.3f / p99 %.3f ms per one-event transaction, %.0f table B and %.0f WAL B"
            " per event (%d autovacuum/analyze); drain %.0f deliveries/s = %.0f events/s; load %.2f"
            % (variant, r["pub_avg_ms"], r["pub_p99_ms"], r["table_b_per_event"], r["wal_b_per_event"],
               r["autovacuums"], r["msg_s"], r["events_s"], load_average()))
        return r
    finally:
        c.destroy()


def scenario_attempt_log(mode, n=None):
    """A fresh drain of n messages (N_ATTEMPT) with outbox_dispatcher.attempt_log = mode."""
    r = scenario_drain(n or N_ATTEMPT, "log %s" % mode,
                       extra={"outbox_dispatcher.attempt_log": "'%s'" % mode, "track_wal_io_timing": "on"})
    want = 1.0 if mode == "all" else 0.0     # every request is answered 200
    if abs(r["attempt_rows_per_msg"] - want) > 1e-9:
        raise RuntimeError("attempt_log = %s: %.3f attempt rows per message" % (mode, r["attempt_rows_per_msg"]))
    log("             outbox.attempts: %.2f rows, %.0f B per message; WAL fsyncs %.3f per message, %.0f us"
        " per message; load %.2f" % (r["attempt_rows_per_msg"], r["attempt_bytes_per_msg"], r["wal_syncs_per_msg"],
                                     r["wal_sync_us"], load_average()))
    return r


# ---------------------------------------------------------------- report

def summary(values):
    v = sorted(values)
    return {"min": v[0], "median": statistics.median(v), "max": v[-1], "runs": v}


def main():
    os.makedirs(OUT, exist_ok=True)
    nginx_pid = start_nginx()
    sink, sink_port = start_sink()
    results = {}
    runs = {}

    def add(key, value):
        runs.setdefault(key, []).append(value)

    version = subprocess.run(["pg_config", "--version"], capture_output=True, text=True).stdout.split()[1]
    log("outbox_dispatcher benchmark: %d cores, PostgreSQL %s, %d runs per scenario" % (os.cpu_count(), version, RUNS))
    if BENCH_CONF:
        log("settings for every cluster (BENCH_CONF): %s" % ", ".join("%s = %s" % kv for kv in BENCH_CONF.items()))
    t_start = time.time()
    try:
        for run in range(RUNS):
            log("run %d of %d" % (run + 1, RUNS))
            add("calibration_s", calibration_seconds())
            add("flush_ms", flush_ms())
            if "fresh" in SCENARIOS:
                r = scenario_drain(N_FRESH, "fresh", by_type=True)
                add("fresh_msg_s", r["msg_s"])
                for k in ("drain_wal_b", "drain_fpi", "insert_wal_b", "hot_pct", "updates_per_msg",
                          "drain_wal_records"):
                    add("fresh_" + k, r[k])
            if "backlog" in SCENARIOS:
                add("backlog_msg_s", scenario_drain(N_BACKLOG, "backlog")["msg_s"])
            if "accrued" in SCENARIOS:
                r = scenario_accrued()
                for k in ("msg_s", "worker_cpu_us", "rows"):
                    add("accrued_" + k, r[k])
            if "retained" in SCENARIOS:
                got = {}
                for variant in rotated(("retained", "fresh"), run):
                    got[variant] = (scenario_retained() if variant == "retained"
                                    else scenario_drain(N_FRESH, "fresh (beside retained)"))
                r = got["retained"]
                add("retained_msg_s", r["msg_s"])
                add("retained_fresh_msg_s", got["fresh"]["msg_s"])
                add("retained_vs_fresh_pct", 100.0 * r["msg_s"] / got["fresh"]["msg_s"])
                for k in ("drain_wal_b", "drain_fpi", "hot_pct"):
                    add("retained_" + k, r[k])
            if "sustained" in SCENARIOS:
                r = scenario_sustained()
                for k, v in r.items():
                    add("sustained_" + k, v)
            if "idle" in SCENARIOS:
                r = scenario_idle(sink_port)
                for k in ("p50_ms", "p99_ms", "start_p50_ms", "ack_p50_ms", "ack_p99_ms", "noflush_p50_ms",
                          "noflush_p99_ms", "rx_p50_ms", "rx_p99_ms", "noflush_rx_p50_ms", "noflush_to_start_p50_ms",
                          "noflush_to_rx_p50_ms", "sink_own_p50_ms"):
                    add("idle_" + k, r[k])
            if "replication" in SCENARIOS:
                for k, v in scenario_replication(sink_port).items():
                    add("repl_" + k, v)
            if "scaling" in SCENARIOS:
                for w in SCALE_WORKERS:
                    got = {}
                    for b in rotated(SCALE_BATCHES, run):
                        got[b] = scenario_drain(N_FRESH, "w%d b%d" % (w, b), workers=w, batch=b)["msg_s"]
                        add("scale_w%d_b%d" % (w, b), got[b])
                    if 100 in got and 500 in got:
                        add("batch_w%d_500_vs_100_pct" % w, 100.0 * got[500] / got[100])
            if "fanout" in SCENARIOS:
                got = {}
                for name, subscribers in rotated(FANOUT_VARIANTS, run):
                    got[name] = r = scenario_fanout(name, subscribers)
                    for k in ("pub_avg_ms", "pub_p99_ms", "table_b_per_event", "wal_b_per_event", "msg_s",
                              "events_s"):
                        add("fanout_%s_%s" % (name, k), r[k])
                for name in ("pub1", "pub5"):
                    add("fanout_%s_vs_enqueue_avg" % name, got[name]["pub_avg_ms"] / got["enqueue"]["pub_avg_ms"])
            if "attempt_log" in SCENARIOS:
                got = {}
                for mode in rotated(ATTEMPT_LOG_MODES, run):
                    got[mode] = r = scenario_attempt_log(mode)
                    for k in ("msg_s", "drain_wal_b", "drain_wal_records", "attempt_bytes_per_msg", "worker_cpu_us",
                              "wal_syncs_per_msg", "wal_sync_us"):
                        add("alog_%s_%s" % (mode, k), r[k])
                for mode in ("all", "failures"):
                    # how much lower the drain rate is than with attempt_log = off in the same run, and
                    # how much more worker CPU a message takes
                    add("alog_%s_slower_pct" % mode, 100.0 * (1.0 - got[mode]["msg_s"] / got["off"]["msg_s"]))
                    add("alog_%s_cpu_pct" % mode,
                        100.0 * (got[mode]["worker_cpu_us"] / got["off"]["worker_cpu_us"] - 1.0))
    finally:
        sink.kill()
        try:
            os.kill(int(open(nginx_pid).read()), 15)
        except OSError:
            pass
        if RETAINED_TEMPLATE:
            shutil.rmtree(RETAINED_TEMPLATE, ignore_errors=True)
    add("calibration_s", calibration_seconds())
    add("flush_ms", flush_ms())
    for k, v in runs.items():
        results[k] = summary(v)
    meta = {"cores": os.cpu_count(), "postgresql": version, "runs": RUNS, "n": N_FRESH, "n_backlog": N_BACKLOG,
            "n_retained": N_RETAINED, "n_repl": N_REPL, "n_fanout": N_FANOUT, "n_attempt": N_ATTEMPT,
            "sustain_s": SUSTAIN_S, "sustain_pairs": SUSTAIN_PAIRS, "sustain_tps": SUSTAIN_TPS,
            "accrue_s": ACCRUE_S, "accrue_tps": ACCRUE_TPS,
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - t_start), "conf": BENCH_CONF}
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    md = render(meta, results)
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write(md)
    print()
    print(md)
    plot(results, os.path.join(OUT, "plot.png"))


ROWS = [
    # key, label, unit, format
    ("calibration_s", "machine speed: CPU time of a fixed loop, before each run and at the end (lower is faster;"
     " compare figures only between runs where it agrees)", "s", "%.3f"),
    ("flush_ms", "machine disk: one 8 kB write + fdatasync where the clusters live, median of 100, before each"
     " run and at the end (a commit waits for one; the speed row does not see it)", "ms", "%.2f"),
    ("fresh_msg_s", "drain %(n)s, fresh table (plans prepared on an empty table)", "msg/s", "%.0f"),
    ("backlog_msg_s", "drain %(n_backlog)s backlog", "msg/s", "%.0f"),
    ("accrued_msg_s", "drain a backlog accrued over %(accrue_s)s s (%(accrue_tps)s transactions/s of 10 messages,"
     " workers paused)", "msg/s", "%.0f"),
    ("accrued_worker_cpu_us", "worker CPU (user + system) per delivered message, accrued backlog", "us", "%.1f"),
    ("accrued_rows", "messages in that accrued backlog", "", "%.0f"),
    ("retained_msg_s", "drain %(n)s with %(n_retained)s done rows retained, analyzed with nothing open", "msg/s", "%.0f"),
    ("retained_fresh_msg_s", "drain %(n)s, fresh table, in the same minute as the retained drain", "msg/s", "%.0f"),
    ("retained_vs_fresh_pct", "retained drain / the fresh drain beside it (target >= 90 %%)", "%", "%.0f"),
    ("sustained_on_avg_ms", "application tx latency avg, %(tps)s msg/s producer, workers delivering", "ms", "%.2f"),
    ("sustained_off_avg_ms", "application tx latency avg, same producer, workers paused", "ms", "%.2f"),
    ("sustained_on_p99_ms", "application tx latency p99, workers delivering", "ms", "%.2f"),
    ("sustained_off_p99_ms", "application tx latency p99, workers paused", "ms", "%.2f"),
    ("sustained_ratio_avg", "application latency avg, delivering / paused", "x", "%.2f"),
    ("sustained_worker_cores", "worker CPU at %(tps)s msg/s", "cores", "%.2f"),
    ("sustained_on_sync_ms", "WAL flush (fsync) time, workers delivering", "ms", "%.2f"),
    ("sustained_off_sync_ms", "WAL flush (fsync) time, workers paused", "ms", "%.2f"),
    ("sustained_on_kb_per_sync", "WAL per flush, workers delivering", "kB", "%.1f"),
    ("sustained_off_kb_per_sync", "WAL per flush, workers paused", "kB", "%.1f"),
    ("sustained_delivery_p50_ms", "delivery latency under that load p50 (producer statement start -> arrival; its"
     " own transaction included)", "ms", "%.1f"),
    ("sustained_delivery_p99_ms", "delivery latency under that load p99", "ms", "%.1f"),
    ("sustained_worker_tx_per_s", "worker transactions per second under that load", "tx/s", "%.0f"),
    ("idle_p50_ms", "idle commit -> arrival p50", "ms", "%.2f"),
    ("idle_p99_ms", "idle commit -> arrival p99", "ms", "%.2f"),
    ("idle_start_p50_ms", "idle producer statement start -> arrival p50 (its commit's WAL flush included)", "ms", "%.2f"),
    ("idle_ack_p50_ms", "idle COMMIT acknowledged to the producer -> arrival p50", "ms", "%.2f"),
    ("idle_ack_p99_ms", "idle COMMIT acknowledged to the producer -> arrival p99", "ms", "%.2f"),
    ("idle_noflush_p50_ms", "idle commit -> arrival p50, producer with synchronous_commit = off (no WAL flush between"
     " its commit timestamp and its message becoming visible)", "ms", "%.2f"),
    ("idle_noflush_p99_ms", "idle commit -> arrival p99, producer with synchronous_commit = off", "ms", "%.2f"),
    ("idle_rx_p50_ms", "idle commit -> request received at the endpoint's socket p50 (the kernel's receive time,"
     " SO_TIMESTAMPNS: without the sink's own wake-up and parsing)", "ms", "%.2f"),
    ("idle_rx_p99_ms", "idle commit -> request received at the endpoint's socket p99", "ms", "%.2f"),
    ("idle_noflush_rx_p50_ms", "idle commit -> received at the socket p50, producer with synchronous_commit = off",
     "ms", "%.2f"),
    ("idle_noflush_to_start_p50_ms", "of which commit -> the worker submits the request p50 (wake, claim; the"
     " attempt log's started_at)", "ms", "%.2f"),
    ("idle_noflush_to_rx_p50_ms", "of which request submitted -> received at the socket p50", "ms", "%.2f"),
    ("idle_sink_own_p50_ms", "the sink's own time from receiving a request to its arrival clock p50 (in every"
     " arrival row above)", "ms", "%.2f"),
    ("repl_drain_off_msg_s", "drain %(n_repl)s, synchronous standby, deliver_after_replication off", "msg/s", "%.0f"),
    ("repl_drain_on_msg_s", "drain %(n_repl)s, synchronous standby, deliver_after_replication on", "msg/s", "%.0f"),
    ("repl_idle_off_p50_ms", "idle commit -> arrival p50, synchronous standby, mode off", "ms", "%.2f"),
    ("repl_idle_on_p50_ms", "idle commit -> arrival p50, synchronous standby, mode on", "ms", "%.2f"),
    ("repl_idle_off_p99_ms", "idle commit -> arrival p99, synchronous standby, mode off", "ms", "%.2f"),
    ("repl_idle_on_p99_ms", "idle commit -> arrival p99, synchronous standby, mode on", "ms", "%.2f"),
    ("fresh_drain_wal_b", "WAL per delivered message, claim + finalize (fresh)", "B", "%.0f"),
    ("retained_drain_wal_b", "WAL per delivered message, claim + finalize (retained)", "B", "%.0f"),
    ("fresh_drain_fpi", "full-page images per delivered message (fresh)", "", "%.3f"),
    ("fresh_insert_wal_b", "WAL per message of the producer's INSERT (for scale)", "B", "%.0f"),
    ("fresh_updates_per_msg", "row updates per delivered message", "", "%.2f"),
    ("fresh_hot_pct", "HOT updates", "%", "%.0f"),
    ("fanout_enqueue_pub_avg_ms", "fan-out baseline: enqueue() of 1 message per event, tx latency avg"
     " (%(n_fanout)s one-event transactions, 1 client, workers paused)", "ms", "%.3f"),
    ("fanout_pub1_pub_avg_ms", "fan-out: publish() to 1 subscribed endpoint, tx latency avg", "ms", "%.3f"),
    ("fanout_pub5_pub_avg_ms", "fan-out: publish() to 5 subscribed endpoints, tx latency avg", "ms", "%.3f"),
    ("fanout_enqueue_pub_p99_ms", "fan-out baseline: enqueue(), tx latency p99", "ms", "%.3f"),
    ("fanout_pub1_pub_p99_ms", "fan-out: publish() to 1 endpoint, tx latency p99", "ms", "%.3f"),
    ("fanout_pub5_pub_p99_ms", "fan-out: publish() to 5 endpoints, tx latency p99", "ms", "%.3f"),
    ("fanout_pub1_vs_enqueue_avg", "fan-out: publish() to 1 endpoint / enqueue(), tx latency avg", "x", "%.2f"),
    ("fanout_pub5_vs_enqueue_avg", "fan-out: publish() to 5 endpoints / enqueue(), tx latency avg", "x", "%.2f"),
    ("fanout_enqueue_table_b_per_event", "fan-out baseline: outbox.messages growth per event (heap, TOAST, indexes),"
     " enqueue()", "B", "%.0f"),
    ("fanout_pub1_table_b_per_event", "fan-out: outbox.messages growth per event, publish() to 1 endpoint", "B", "%.0f"),
    ("fanout_pub5_table_b_per_event", "fan-out: outbox.messages growth per event, publish() to 5 endpoints", "B", "%.0f"),
    ("fanout_enqueue_wal_b_per_event", "fan-out baseline: WAL per event (its transaction), enqueue()", "B", "%.0f"),
    ("fanout_pub1_wal_b_per_event", "fan-out: WAL per event, publish() to 1 endpoint", "B", "%.0f"),
    ("fanout_pub5_wal_b_per_event", "fan-out: WAL per event, publish() to 5 endpoints", "B", "%.0f"),
    ("fanout_enqueue_msg_s", "fan-out baseline: drain of the enqueued messages", "deliveries/s", "%.0f"),
    ("fanout_pub1_msg_s", "fan-out: drain, 1 endpoint", "deliveries/s", "%.0f"),
    ("fanout_pub5_msg_s", "fan-out: drain, 5 endpoints", "deliveries/s", "%.0f"),
    ("fanout_pub1_events_s", "fan-out: drain, 1 endpoint", "events/s", "%.0f"),
    ("fanout_pub5_events_s", "fan-out: drain, 5 endpoints", "events/s", "%.0f"),
    ("alog_all_msg_s", "drain %(n_attempt)s, fresh table, attempt_log = all", "msg/s", "%.0f"),
    ("alog_failures_msg_s", "drain %(n_attempt)s, fresh table, attempt_log = failures (all answered 200: nothing"
     " logged)", "msg/s", "%.0f"),
    ("alog_off_msg_s", "drain %(n_attempt)s, fresh table, attempt_log = off", "msg/s", "%.0f"),
    ("alog_all_slower_pct", "attempt_log = all: drain rate below off's in the same run (target <= 15 %%)", "%", "%.1f"),
    ("alog_failures_slower_pct", "attempt_log = failures: drain rate below off's in the same run", "%", "%.1f"),
    ("alog_all_worker_cpu_us", "worker CPU (user + system) per delivered message, attempt_log = all", "us", "%.0f"),
    ("alog_failures_worker_cpu_us", "worker CPU per delivered message, attempt_log = failures", "us", "%.0f"),
    ("alog_off_worker_cpu_us", "worker CPU per delivered message, attempt_log = off", "us", "%.0f"),
    ("alog_all_cpu_pct", "attempt_log = all: worker CPU per message above off's in the same run", "%", "%.1f"),
    ("alog_failures_cpu_pct", "attempt_log = failures: worker CPU per message above off's in the same run",
     "%", "%.1f"),
    ("alog_all_drain_wal_b", "WAL per delivered message, attempt_log = all", "B", "%.0f"),
    ("alog_failures_drain_wal_b", "WAL per delivered message, attempt_log = failures", "B", "%.0f"),
    ("alog_off_drain_wal_b", "WAL per delivered message, attempt_log = off", "B", "%.0f"),
    ("alog_all_wal_sync_us", "WAL fsync time per delivered message (track_wal_io_timing), attempt_log = all",
     "us", "%.0f"),
    ("alog_failures_wal_sync_us", "WAL fsync time per delivered message, attempt_log = failures", "us", "%.0f"),
    ("alog_off_wal_sync_us", "WAL fsync time per delivered message, attempt_log = off", "us", "%.0f"),
    ("alog_all_wal_syncs_per_msg", "WAL fsyncs per delivered message, attempt_log = all", "", "%.4f"),
    ("alog_off_wal_syncs_per_msg", "WAL fsyncs per delivered message, attempt_log = off", "", "%.4f"),
    ("alog_all_drain_wal_records", "WAL records per delivered message, attempt_log = all", "", "%.1f"),
    ("alog_off_drain_wal_records", "WAL records per delivered message, attempt_log = off", "", "%.1f"),
    ("alog_all_attempt_bytes_per_msg", "outbox.attempts growth per delivered message (partitions and indexes),"
     " attempt_log = all", "B", "%.0f"),
]


def render(meta, results):
    fmt = {"n": "{:,}".format(meta["n"]), "n_backlog": "{:,}".format(meta["n_backlog"]),
           "n_retained": "{:,}".format(meta["n_retained"]),
           "n_repl": "{:,}".format(meta.get("n_repl", 0)), "tps": "{:,}".format(meta["sustain_tps"] * 10),
           "n_fanout": "{:,}".format(meta.get("n_fanout", 0)), "n_attempt": "{:,}".format(meta.get("n_attempt", 0)),
           "accrue_s": meta.get("accrue_s", 0), "accrue_tps": "{:,}".format(meta.get("accrue_tps", 0))}
    lines = ["outbox_dispatcher %s, PostgreSQL %s, %d cores, %s; %d runs per figure (min / median / max)."
             % (library_version(), meta["postgresql"], meta["cores"], meta["date"], meta["runs"])
             + ("" if not meta.get("conf") else " Settings changed on every cluster: %s."
                % ", ".join("`%s = %s`" % kv for kv in meta["conf"].items())), "",
             "| scenario | min | median | max | unit |", "|---|---:|---:|---:|---|"]
    for key, label, unit, f in ROWS:
        if key not in results:
            continue
        r = results[key]
        lines.append("| %s | %s | **%s** | %s | %s |" % (label % fmt, f % r["min"], f % r["median"], f % r["max"], unit))
    scale = [k for k in results if k.startswith("scale_")]
    if scale:
        lines += ["", "Drain of %s messages by workers and batch_size (median msg/s, min-max):" % fmt["n"], "",
                  "| workers | batch_size 100 | batch_size 500 | 500 / 100 in the same run (target >= 100 %) |",
                  "|---:|---:|---:|---:|"]
        for w in (1, 2, 4):
            cells = []
            for b in (100, 500):
                r = results.get("scale_w%d_b%d" % (w, b))
                cells.append("%.0f (%.0f-%.0f)" % (r["median"], r["min"], r["max"]) if r else "-")
            r = results.get("batch_w%d_500_vs_100_pct" % w)
            cells.append("%.0f %% (%.0f-%.0f)" % (r["median"], r["min"], r["max"]) if r else "-")
            lines.append("| %d | %s | %s | %s |" % (w, cells[0], cells[1], cells[2]))
    return "\n".join(lines) + "\n"


def library_version():
    try:
        with open(os.path.join(SRC, "outbox_dispatcher.control")) as f:
            for line in f:
                if line.startswith("default_version"):
                    return line.split("=")[1].strip().strip("'")
    except OSError:
        pass
    return "?"


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("(matplotlib not installed: no plot)")
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = [("fresh_msg_s", "fresh"), ("backlog_msg_s", "backlog"), ("retained_msg_s", "1M retained")]
    keys = [(k, l) for k, l in keys if k in results]
    med = [results[k]["median"] for k, _ in keys]
    err = [[results[k]["median"] - results[k]["min"] for k, _ in keys],
           [results[k]["max"] - results[k]["median"] for k, _ in keys]]
    a1.bar([l for _, l in keys], med, yerr=err, capsize=6, color="#4477aa")
    a1.set_ylabel("msg/s (median, min-max)")
    a1.set_title("drain rate")
    for w in (1, 2, 4):
        xs, ys = [], []
        for b in (100, 500):
            r = results.get("scale_w%d_b%d" % (w, b))
            if r:
                xs.append(b)
                ys.append(r["median"])
        if xs:
            a2.plot(xs, ys, marker="o", label="%d workers" % w)
    a2.set_xlabel("batch_size")
    a2.set_ylabel("msg/s (median)")
    a2.set_title("scaling")
    if a2.lines:
        a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    log("plot: %s" % path)


if __name__ == "__main__":
    main()
