#!/usr/bin/python3
"""Scriptable HTTP sink for the outbox_dispatcher tests.

Standard library only (Python 3.11).  Listens on loopback, records every
non-control request, and answers according to per-path scripts set through a
small JSON control API under /_control/.

Usage:
    /usr/bin/python3 test/sink/sink.py --port 0 --port-file DIR/port \
        [--log DIR/requests.jsonl] [--host 127.0.0.1] [--watch-pid PID]
        [--max-records N] [--verbose]

--port 0 picks a free port; the chosen port is written (atomically, via
rename) to --port-file once the socket is listening, as "PORT\\n".  The port
file is removed again on a clean exit (SIGTERM/SIGINT or /_control/shutdown).
--watch-pid makes the sink exit by itself once that process is gone.
Memory: about 2 KB per recorded request (headers are kept twice, see
headers_lc); --max-records N bounds it for soak runs (only the most recent
N..2N requests stay visible in /_control/requests; stats, ids and the log
file still cover everything).

Control API (JSON in / JSON out):

  POST /_control/script    {"path": "/p", "status": 200, "delay_ms": 0,
                            "fail_first": 0, "fail_status": 503,
                            "fail_mode": null, "retry_after": null, "location": null,
                            "mode": null, "body": null, "body_bytes": 8388608,
                            "content_type": "application/json", "headers": {},
                            "fail_ratio": 0, "delay_ratio": 0, "delay_ratio_ms": 0,
                            "seed": null}
      Sets the behaviour for requests to that exact path (query string
      ignored).  Omitted fields take the defaults above; posting again for a
      path replaces its script and restarts its fail_first counting.
      path "*" sets the behaviour for every path that has no script of its
      own.  Unscripted paths answer 200 with body "{}".
        status       response status (200..999)
        delay_ms     sleep before answering (after the request was recorded)
        fail_first   N: for each distinct Idempotency-Key value the first N
                     requests get fail_status (or fail_mode), later ones get
                     status (and mode).  Requests without an Idempotency-Key
                     count as one (empty) key.
        fail_mode    mode for those first N requests instead of a fail_status
                     answer, e.g. {"fail_first": 2, "fail_mode": "hang"}: the
                     first two attempts time out, the third gets `status`.
        retry_after  value of a Retry-After header sent with fail responses and
                     with non-2xx `status` responses
        location     Location header value (sent on every response of the path)
        mode         for the requests that are not failing (see fail_first):
                     null (normal answer)
                     "hang"   read the request, never answer; keep the
                              connection open until the client gives up
                     "close"  read the request, close the socket (FIN) without
                              answering
                     "reset"  read the request, abort the connection (RST)
                     "close_mid_response"  send status line + headers with a
                              Content-Length larger than what is sent, send
                              half of the body, close
                     "huge_body"  answer `status` with a body of body_bytes
                              bytes (default 8 MiB), streamed in 64 KiB chunks
        body         response body string for `status` responses (default "{}")
        body_seq     true: every %SEQ% in body becomes the request's seq (a
                     token endpoint handing out a new token per request)
        headers      extra response headers {name: value}
        fail_ratio   0..1: each request that fail_first does not already fail
                     independently fails with this probability: answered with
                     fail_status (or handled by fail_mode, if set), like a
                     fail_first failure (Retry-After included)
        delay_ratio  0..1: each request is independently delayed by an extra
        delay_ratio_ms  delay_ratio_ms (added to delay_ms) with this
                     probability
        seed         optional integer: the random draws of fail_ratio and
                     delay_ratio come from a generator seeded with it, so the
                     n-th request of the script (in arrival order) gets the
                     same decisions in every run; without a seed they differ
                     from run to run.  Two draws are made per request (fail,
                     then delay), whatever the ratios.
  POST /_control/reset     clears scripts, recorded requests and counters
                           (seq restarts at 1).
  GET  /_control/requests[?path=/p][&id=KEY][&since=SEQ][&limit=N]
      JSON list, arrival order, of
        {"seq", "status", "path", "query", "method", "headers", "headers_lc",
         "body", "t", "t_rx"}
      headers    = {name: value} with header names exactly as received
                   (repeated headers joined with ", ")
      headers_lc = the same with lower-cased names: use it for lookups
      body       = request body decoded as UTF-8 (invalid bytes replaced)
      t          = arrival time, float unix seconds: the sink's clock once it
                   has read the request head
      t_rx       = when the kernel received the request's first bytes
                   (SO_TIMESTAMPNS, float unix seconds; the same clock as t,
                   without the sink's own wake-up and parsing); null where
                   the platform does not give it
      status     = status the sink answers (decided on arrival, before the
                   delay); null for hang / close / reset
  GET  /_control/stats[?path=/p]
      {"total", "by_path": {path: n}, "by_status": {"200": n, "none": n},
       "distinct_ids", "duplicates", "ok_distinct_ids", "ok_duplicates",
       "random_failures", "random_delays", "in_flight", "dropped_records",
       "open_connections"}
      distinct_ids = distinct Idempotency-Key values, duplicates = requests
      beyond the first per key (requests without the header are not counted
      in either); ok_distinct_ids / ok_duplicates = the same over the
      requests answered 2xx only (decided on arrival).  random_failures /
      random_delays count fail_ratio / delay_ratio hits.  With ?path= the id
      figures are for that path only (the random_* counters are global).
      in_flight = recorded requests whose answer has not started to go out
      (hang, close and reset ones until they end).
  GET  /_control/ids[?path=/p][&ok=1]  {idempotency_key: count}
      with ok=1: counts of the requests answered 2xx only (keys with none
      are left out)
  GET  /_control/wait?count=N[&path=/p][&timeout=S]
      blocks until at least N requests (to path, if given) were recorded or
      the timeout (default 10 s) passes: {"ok": bool, "count": n}
  GET  /_control/scripts               current scripts
  GET  /_control/health                {"ok": true, "pid": n, "port": n}
  POST /_control/shutdown              answers, then stops the server

Every non-control request (any method) is recorded before the delay and, with
--log, appended to the log file as one JSON line (same object as in
/_control/requests), flushed per line.
"""

import argparse
import http
import io
import json
import os
import random
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

MAX_LINE = 65536
MAX_HEADERS = 200
MAX_BODY = 256 * 1024 * 1024
CHUNK = b"x" * 65536
MODES = (None, "hang", "close", "reset", "close_mid_response", "huge_body")
SCRIPT_DEFAULTS = {
    "status": 200,
    "delay_ms": 0,
    "fail_first": 0,
    "fail_status": 503,
    "fail_mode": None,
    "retry_after": None,
    "location": None,
    "mode": None,
    "body": None,
    "body_bytes": 8 * 1024 * 1024,
    "content_type": "application/json",
    "headers": None,
    "fail_ratio": 0,
    "delay_ratio": 0,
    "delay_ratio_ms": 0,
    "seed": None,
    "body_seq": False,
}
NO_BODY_STATUSES = (204, 304)
QUIET_ERRORS = (ConnectionError, TimeoutError, socket.timeout, OSError)


_date_cache = (0, "")


def http_date():
    global _date_cache
    now = int(time.time())
    cached = _date_cache
    if cached[0] != now:
        cached = _date_cache = (now, formatdate(now, usegmt=True))
    return cached[1]


_reasons = {}


def reason_phrase(status):
    r = _reasons.get(status)
    if r is None:
        try:
            r = http.HTTPStatus(status).phrase
        except ValueError:
            r = "Status"
        _reasons[status] = r
    return r


class BadRequest(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


class Script:
    __slots__ = ("path", "cfg", "seen", "rng")

    def __init__(self, path, cfg):
        self.path = path
        self.cfg = cfg
        self.seen = {}  # idempotency key -> requests seen by this script
        self.rng = random.Random(cfg["seed"])  # seed None: from os.urandom


def validate_script(doc):
    if not isinstance(doc, dict):
        raise BadRequest(400, "script must be a JSON object")
    unknown = set(doc) - set(SCRIPT_DEFAULTS) - {"path"}
    if unknown:
        raise BadRequest(400, "unknown script field(s): %s" % ", ".join(sorted(unknown)))
    path = doc.get("path")
    if not isinstance(path, str) or not (path.startswith("/") or path == "*"):
        raise BadRequest(400, "path must be a string starting with / (or \"*\")")
    if path.startswith("/_control/"):
        raise BadRequest(400, "cannot script /_control/ paths")
    cfg = dict(SCRIPT_DEFAULTS)
    for k, v in doc.items():
        if k != "path" and v is not None:
            cfg[k] = v

    floats = ("delay_ms", "fail_ratio", "delay_ratio", "delay_ratio_ms")
    for name in ("status", "fail_status", "fail_first", "body_bytes", "seed") + floats:
        v = cfg[name]
        if isinstance(v, str):  # tolerate "200" (e.g. from Perl scalars)
            try:
                cfg[name] = float(v) if name in floats else int(v)
            except ValueError:
                raise BadRequest(400, "%s must be a number" % name)

    def int_field(name, lo, hi):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or not lo <= v <= hi:
            raise BadRequest(400, "%s must be an integer in [%d, %d]" % (name, lo, hi))
        cfg[name] = int(v)

    int_field("status", 200, 999)
    int_field("fail_status", 200, 999)
    int_field("fail_first", 0, 1 << 31)
    int_field("body_bytes", 0, 1 << 40)
    for name in ("delay_ms", "delay_ratio_ms"):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise BadRequest(400, "%s must be a number >= 0" % name)
    for name in ("fail_ratio", "delay_ratio"):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise BadRequest(400, "%s must be a number in [0, 1]" % name)
    if cfg["seed"] is not None:
        v = cfg["seed"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
            raise BadRequest(400, "seed must be an integer")
        cfg["seed"] = int(v)
    for name in ("mode", "fail_mode"):
        if cfg[name] not in MODES:
            raise BadRequest(400, "%s must be one of %s" % (name, ", ".join(str(m) for m in MODES)))
    if cfg["retry_after"] is not None:
        if isinstance(cfg["retry_after"], bool) or not isinstance(cfg["retry_after"], (str, int, float)):
            raise BadRequest(400, "retry_after must be a string (or number)")
        cfg["retry_after"] = str(cfg["retry_after"])
    if isinstance(cfg["body_seq"], str):  # "1"/"0" from Perl scalars
        cfg["body_seq"] = {"1": True, "true": True, "0": False, "false": False}.get(cfg["body_seq"], cfg["body_seq"])
    if not isinstance(cfg["body_seq"], (bool, int)) or cfg["body_seq"] not in (True, False, 0, 1):
        raise BadRequest(400, "body_seq must be a boolean")
    cfg["body_seq"] = bool(cfg["body_seq"])
    for name in ("location", "body", "content_type"):
        if cfg[name] is not None and not isinstance(cfg[name], str):
            raise BadRequest(400, "%s must be a string" % name)
    hdrs = cfg["headers"]
    if hdrs is not None:
        if not isinstance(hdrs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hdrs.items()):
            raise BadRequest(400, "headers must be an object of strings")
    for s in [cfg["retry_after"], cfg["location"], cfg["content_type"]] + list((hdrs or {}).items()):
        for part in (s if isinstance(s, tuple) else (s,)):
            if part is not None and ("\r" in part or "\n" in part):
                raise BadRequest(400, "CR/LF not allowed in header values")
    return path, cfg


class State:
    def __init__(self, log_path, max_records=0):
        self.max_records = max_records
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.log = open(log_path, "ab") if log_path else None
        self.in_flight = 0
        self.open_connections = 0
        self._clear()

    def _clear(self):
        self.scripts = {}
        self.records = []  # (seq, path, key, JSON line as UTF-8 bytes) -- append-only
        self.next_seq = 1
        self.dropped = 0
        self.total = 0
        self.by_path = {}
        self.by_status = {}
        self.ids = {}
        self.ids_by_path = {}
        self.keyed_total = 0
        self.keyed_by_path = {}
        self.ok_ids = {}
        self.ok_ids_by_path = {}
        self.ok_keyed_total = 0
        self.ok_keyed_by_path = {}
        self.random_failures = 0
        self.random_delays = 0

    def reset(self):
        with self.lock:
            self._clear()
            self.cond.notify_all()

    def set_script(self, path, cfg):
        with self.lock:
            self.scripts[path] = Script(path, cfg)

    def record(self, path, key, rest_json, t):
        """Decide the answer for a request and record it.

        rest_json is the JSON object (without seq/status) serialised to UTF-8
        bytes by the caller.  Returns (seq, cfg, status, failing, mode, delay_s)."""
        with self.lock:
            script = self.scripts.get(path) or self.scripts.get("*")
            cfg = script.cfg if script else SCRIPT_DEFAULTS
            failing = False
            delay = cfg["delay_ms"] / 1000.0
            if script is not None and cfg["fail_first"] > 0:
                k = key if key is not None else ""
                n = script.seen.get(k, 0)
                script.seen[k] = n + 1
                failing = n < cfg["fail_first"]
            if script is not None and (cfg["fail_ratio"] > 0 or cfg["delay_ratio"] > 0):
                r_fail = script.rng.random()
                r_delay = script.rng.random()
                if not failing and r_fail < cfg["fail_ratio"]:
                    failing = True
                    self.random_failures += 1
                if r_delay < cfg["delay_ratio"]:
                    delay += cfg["delay_ratio_ms"] / 1000.0
                    self.random_delays += 1
            mode = cfg["fail_mode"] if failing else cfg["mode"]
            if mode in ("hang", "close", "reset"):
                status = None
            elif failing:
                status = cfg["fail_status"]
            else:
                status = cfg["status"]
            seq = self.next_seq
            self.next_seq += 1
            line = b'{"seq":%d,"status":%s,' % (seq, b"null" if status is None else b"%d" % status) + rest_json[1:]
            self.records.append((seq, path, key, line))
            if self.max_records and len(self.records) >= 2 * self.max_records:
                # readers hold a reference to the old list, so build a new one
                cut = len(self.records) - self.max_records
                self.records = self.records[cut:]
                self.dropped += cut
            self.total += 1
            self.by_path[path] = self.by_path.get(path, 0) + 1
            sk = "none" if status is None else str(status)
            self.by_status[sk] = self.by_status.get(sk, 0) + 1
            if key is not None:
                self.ids[key] = self.ids.get(key, 0) + 1
                self.keyed_total += 1
                pids = self.ids_by_path.get(path)
                if pids is None:
                    pids = self.ids_by_path[path] = {}
                pids[key] = pids.get(key, 0) + 1
                self.keyed_by_path[path] = self.keyed_by_path.get(path, 0) + 1
                if status is not None and 200 <= status < 300:
                    self.ok_ids[key] = self.ok_ids.get(key, 0) + 1
                    self.ok_keyed_total += 1
                    pids = self.ok_ids_by_path.get(path)
                    if pids is None:
                        pids = self.ok_ids_by_path[path] = {}
                    pids[key] = pids.get(key, 0) + 1
                    self.ok_keyed_by_path[path] = self.ok_keyed_by_path.get(path, 0) + 1
            if self.log is not None:
                try:
                    self.log.write(line + b"\n")
                    self.log.flush()
                except OSError as e:
                    sys.stderr.write("sink: cannot write log: %s\n" % e)
            self.in_flight += 1
            self.cond.notify_all()
            return seq, cfg, status, failing, mode, delay

    def count(self, path):
        if path is None:
            return self.total
        return self.by_path.get(path, 0)


# SO_TIMESTAMPNS: the kernel's receive time of each segment, as a control
# message of recvmsg() (Linux; the socket module does not name it).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35) if sys.platform.startswith("linux") else None


def enable_rx_stamps(sock):
    """Ask for receive timestamps on sock (a listening socket passes it on to
    the connections it accepts); False where that is not available."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


class StampedReader(io.RawIOBase):
    """A connection's raw reader that keeps the kernel receive time of what
    it reads: `last` of the latest recvmsg(), `first` of the first one since
    mark() (None until one came)."""

    _ANC = socket.CMSG_SPACE(16)

    def __init__(self, sock):
        super().__init__()
        self._sock = sock
        self.last = None
        self.first = None

    def readable(self):
        return True

    def mark(self):
        self.first = None

    def readinto(self, b):
        n, anc, _flags, _addr = self._sock.recvmsg_into([b], self._ANC)
        stamp = None
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = struct.unpack("qq", data[:16])
                stamp = sec + nsec * 1e-9
        self.last = stamp
        if self.first is None:
            self.first = stamp
        return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    request_version = "HTTP/1.1"  # until a request line was parsed
    server_version = "od-sink/1"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = None  # idle keep-alive connections stay until the client closes

    # ---- plumbing -------------------------------------------------------

    def setup(self):
        super().setup()
        self._rx = None
        if self.server.rx_stamps:
            # the same buffered reading, through a reader that keeps the
            # kernel's receive times (t_rx); the socket's own file is closed
            # so that closing the connection closes its descriptor
            self.rfile.close()
            self._rx = StampedReader(self.connection)
            self.rfile = io.BufferedReader(self._rx, 65536)
        st = self.server.state
        with st.lock:
            st.open_connections += 1

    def finish(self):
        st = self.server.state
        with st.lock:
            st.open_connections -= 1
        try:
            super().finish()
        except QUIET_ERRORS:
            pass

    def handle(self):
        self.close_connection = True
        try:
            self.handle_one_request()
            while not self.close_connection:
                self.handle_one_request()
        except QUIET_ERRORS:
            self.close_connection = True
        except Exception as e:  # never let one bad request kill anything
            self.close_connection = True
            if self.server.verbose:
                import traceback

                traceback.print_exc()
            else:
                sys.stderr.write("sink: internal error: %r\n" % (e,))

    def log_message(self, format, *args):
        if self.server.verbose:
            sys.stderr.write("sink: %s %s\n" % (self.address_string(), format % args))

    def _readline(self):
        line = self.rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise BadRequest(431, "line too long")
        return line

    def _send(self, status, body=b"", headers=(), close=False, head=False, content_length=None):
        """Write a complete response with a single sendall()."""
        self._leave()  # a recorded request is no longer in flight once its answer goes out
        out = ["HTTP/1.1 %d %s\r\nServer: od-sink/1\r\nDate: %s\r\n"
               % (status, reason_phrase(status), http_date())]
        for k, v in headers:
            out.append("%s: %s\r\n" % (k, v))
        if status not in NO_BODY_STATUSES:
            out.append("Content-Length: %d\r\n" % (len(body) if content_length is None else content_length))
        else:
            body = b""
        if close or self.close_connection:
            out.append("Connection: close\r\n")
            self.close_connection = True
        elif self.request_version == "HTTP/1.0":
            out.append("Connection: keep-alive\r\n")
        out.append("\r\n")
        data = "".join(out).encode("latin-1", "replace")
        if body and not head:
            data += body
        self.wfile.write(data)
        self.log_request(status)

    def _send_json(self, status, obj, close=False):
        if isinstance(obj, bytes):
            body = obj
        else:
            body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
        self._send(status, body, (("Content-Type", "application/json"),), close=close)

    def _read_body(self, hl):
        te = hl.get("transfer-encoding")
        if te is not None:
            if te.strip().lower() != "chunked":
                raise BadRequest(501, "unsupported transfer-encoding")
            parts = []
            size = 0
            while True:
                line = self._readline()
                if not line:
                    raise ConnectionError("eof in chunked body")
                try:
                    n = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise BadRequest(400, "bad chunk size")
                if n == 0:
                    while True:  # trailers
                        line = self._readline()
                        if line in (b"\r\n", b"\n", b""):
                            break
                    break
                size += n
                if size > MAX_BODY:
                    raise BadRequest(413, "body too large")
                data = self.rfile.read(n)
                if len(data) < n:
                    raise ConnectionError("eof in chunked body")
                parts.append(data)
                self.rfile.readline(3)  # CRLF after chunk
            return b"".join(parts)
        cl = hl.get("content-length")
        if cl is None:
            return b""
        try:
            n = int(cl)
            if n < 0:
                raise ValueError
        except ValueError:
            raise BadRequest(400, "bad content-length")
        if n > MAX_BODY:
            raise BadRequest(413, "body too large")
        if n == 0:
            return b""
        data = self.rfile.read(n)
        if len(data) < n:
            raise ConnectionError("eof in body")
        return data

    # ---- one request ----------------------------------------------------

    def _read_head(self):
        """Read request line + header lines (without line endings).

        Fast path: the whole head is already in the read buffer, so it is
        taken with one read() instead of one readline() per header.
        Returns (request_line, [header_lines]) or None on EOF."""
        rf = self.rfile
        while True:
            buf = rf.peek(1)
            if not buf:
                return None
            if buf[:2] == b"\r\n":  # tolerate stray CRLF between requests
                rf.read(2)
                continue
            if buf[:1] == b"\n":
                rf.read(1)
                continue
            break
        end = buf.find(b"\r\n\r\n", 0, MAX_LINE * 4)
        if end >= 0:
            lines = rf.read(end + 4)[:end].split(b"\n")
            lines = [ln[:-1] if ln[-1:] == b"\r" else ln for ln in lines]
            if len(lines) > MAX_HEADERS + 1:
                raise BadRequest(431, "too many headers")
            if max(map(len, lines)) > MAX_LINE:
                raise BadRequest(431, "line too long")
            return lines[0], lines[1:]
        line = self._readline()
        while line in (b"\r\n", b"\n"):
            line = self._readline()
        if not line:
            return None
        hlines = []
        while True:
            hline = self._readline()
            if hline in (b"\r\n", b"\n"):
                break
            if not hline:
                raise ConnectionError("eof in request head")
            if len(hlines) >= MAX_HEADERS:
                raise BadRequest(431, "too many headers")
            hlines.append(hline.rstrip(b"\r\n"))
        return line.rstrip(b"\r\n"), hlines

    def handle_one_request(self):
        self.close_connection = True
        try:
            rx = self._rx
            if rx is not None:
                # the head's first bytes come with the next recvmsg(), or came
                # with the latest one if they are already in the buffer
                before = rx.last
                rx.mark()
            head = self._read_head()
            if head is None:
                return
            t = time.time()
            t_rx = None
            if rx is not None:
                t_rx = rx.first if rx.first is not None else before
            line, hlines = head
            self.raw_requestline = line
            self.requestline = line.decode("latin-1")
            words = self.requestline.split()
            if len(words) != 3 or not words[2].startswith("HTTP/"):
                raise BadRequest(400, "bad request line")
            method, target, version = words
            self.command, self.path, self.request_version = method, target, version
            headers = {}
            hl = {}
            last = None
            for hline in hlines:
                s = hline.decode("latin-1")
                if s[:1] in (" ", "\t") and last is not None:  # obsolete folding
                    headers[last] = headers[last] + " " + s.strip()
                    hl[last.lower()] = hl[last.lower()] + " " + s.strip()
                    continue
                name, sep, value = s.partition(":")
                if not sep or not name or name != name.strip():
                    raise BadRequest(400, "bad header line")
                value = value.strip()
                lname = name.lower()
                if name in headers:
                    headers[name] = headers[name] + ", " + value
                else:
                    headers[name] = value
                if lname in hl:
                    hl[lname] = hl[lname] + ", " + value
                else:
                    hl[lname] = value
                last = name
            conn = hl.get("connection", "").lower()
            if version == "HTTP/1.1":
                keep = "close" not in conn
            elif version == "HTTP/1.0":
                keep = "keep-alive" in conn
            else:
                raise BadRequest(505, "HTTP version not supported")
            if hl.get("expect", "").lower() == "100-continue" and version == "HTTP/1.1":
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self._read_body(hl)
            self.close_connection = not keep
        except BadRequest as e:
            try:
                self._send_json(e.status, {"error": str(e)}, close=True)
            except QUIET_ERRORS:
                pass
            return

        raw_target = target  # absolute-form when the request came through a proxy
        if target.startswith("http://") or target.startswith("https://"):
            slash = target.find("/", target.find("//") + 2)
            target = target[slash:] if slash >= 0 else "/"
        path, _, query = target.partition("?")
        if path.startswith("/_control/"):
            try:
                self.control(method, path, query, body)
            except BadRequest as e:
                self._send_json(e.status, {"error": str(e)})
            return
        self.sink(method, path, query, headers, hl, body, t, raw_target, t_rx)

    # ---- recorded (non-control) requests --------------------------------

    def sink(self, method, path, query, headers, hl, body, t, target, t_rx=None):
        st = self.server.state
        key = hl.get("idempotency-key")
        rest = json.dumps(
            {
                "path": path,
                "query": query,
                "method": method,
                "target": target,
                "headers": headers,
                "headers_lc": hl,
                "body": body.decode("utf-8", "replace"),
                "t": t,
                "t_rx": t_rx,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8", "surrogatepass")
        seq, cfg, status, failing, mode, delay = st.record(path, key, rest, t)
        # in flight until its answer starts going out: a client may send its
        # next request on this connection as soon as the answer is complete,
        # before a decrement after the write would have run
        self._counted = True
        try:
            self._answer(method, cfg, status, failing, mode, seq, delay)
        finally:
            self._leave()

    def _leave(self):
        if getattr(self, "_counted", False):
            self._counted = False
            st = self.server.state
            with st.lock:
                st.in_flight -= 1

    def _answer(self, method, cfg, status, failing, mode, seq, delay):
        if delay:
            time.sleep(delay)
        head = method == "HEAD"
        if mode == "hang":
            self._hang()
            return
        if mode == "close":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if mode == "reset":
            self.close_connection = True
            try:
                import struct

                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass
            return

        hdrs = [("X-Sink-Seq", str(seq))]
        if cfg["location"] is not None:
            hdrs.append(("Location", cfg["location"]))
        if cfg["retry_after"] is not None and (failing or not 200 <= status < 300):
            hdrs.append(("Retry-After", cfg["retry_after"]))
        if cfg["headers"]:
            hdrs.extend(cfg["headers"].items())

        if failing and mode is None:
            body = b'{"sink":"scripted failure"}'
            hdrs.append(("Content-Type", "application/json"))
            self._send(status, body, hdrs, head=head)
            return
        if cfg["content_type"]:
            hdrs.append(("Content-Type", cfg["content_type"]))

        if mode == "huge_body":
            total = cfg["body_bytes"]
            self._send(status, b"", hdrs, head=True, content_length=total)
            if head or status in NO_BODY_STATUSES:
                return
            view = memoryview(CHUNK)
            left = total
            w = self.wfile
            while left > 0:
                n = min(left, len(CHUNK))
                w.write(view[:n])
                left -= n
            return
        if mode == "close_mid_response":
            body = cfg["body"].encode("utf-8") if cfg["body"] else b""
            if len(body) < 2:
                body = b'{"pad":"' + CHUNK[:1000] + b'"}'
            self._send(status, b"", hdrs, head=True, content_length=len(body))
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        text = cfg["body"] if cfg["body"] is not None else "{}"
        if cfg["body_seq"]:
            text = text.replace("%SEQ%", str(seq))
        self._send(status, text.encode("utf-8"), hdrs, head=head)

    def _hang(self):
        """Never answer; drain the socket until the client closes it."""
        self.close_connection = True
        sock = self.connection
        server = self.server
        try:
            sock.settimeout(0.5)
            while not server.stopping:
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
        except OSError:
            pass

    # ---- control API ----------------------------------------------------

    def control(self, method, path, query, body):
        st = self.server.state
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        name = path[len("/_control/"):].rstrip("/")

        def need(m):
            if method != m and not (m == "GET" and method == "HEAD"):
                raise BadRequest(405, "use %s for /_control/%s" % (m, name))

        def jbody():
            try:
                return json.loads(body.decode("utf-8")) if body.strip() else {}
            except (ValueError, UnicodeDecodeError) as e:
                raise BadRequest(400, "invalid JSON: %s" % e)

        def qint(k, default):
            if k not in q or q[k] == "":
                return default
            try:
                return int(q[k])
            except ValueError:
                raise BadRequest(400, "%s must be an integer" % k)

        if name == "script":
            need("POST")
            doc = jbody()
            docs = doc if isinstance(doc, list) else [doc]
            done = []
            for d in docs:
                p, cfg = validate_script(d)
                done.append((p, cfg))
            for p, cfg in done:
                st.set_script(p, cfg)
            out = [dict(cfg, path=p) for p, cfg in done]
            self._send_json(200, {"ok": True, "script": out if isinstance(doc, list) else out[0]})
        elif name == "reset":
            need("POST")
            st.reset()
            self._send_json(200, {"ok": True})
        elif name == "requests":
            need("GET")
            p = q.get("path")
            key = q.get("id")
            since = qint("since", 0)
            limit = qint("limit", -1)
            with st.lock:
                recs = st.records
                n = len(recs)
            lines = []
            for i in range(n):
                seq, rp, rk, line = recs[i]
                if seq <= since or (p is not None and rp != p) or (key is not None and rk != key):
                    continue
                lines.append(line)
                if 0 <= limit <= len(lines):
                    break
            self._send_json(200, b"[" + b",".join(lines) + b"]")
        elif name == "stats":
            need("GET")
            p = q.get("path")
            with st.lock:
                if p is None:
                    distinct = len(st.ids)
                    dups = st.keyed_total - distinct
                    ok_distinct = len(st.ok_ids)
                    ok_dups = st.ok_keyed_total - ok_distinct
                else:
                    distinct = len(st.ids_by_path.get(p, {}))
                    dups = st.keyed_by_path.get(p, 0) - distinct
                    ok_distinct = len(st.ok_ids_by_path.get(p, {}))
                    ok_dups = st.ok_keyed_by_path.get(p, 0) - ok_distinct
                out = {
                    "total": st.total,
                    "by_path": dict(st.by_path),
                    "by_status": dict(st.by_status),
                    "distinct_ids": distinct,
                    "duplicates": dups,
                    "ok_distinct_ids": ok_distinct,
                    "ok_duplicates": ok_dups,
                    "random_failures": st.random_failures,
                    "random_delays": st.random_delays,
                    "in_flight": st.in_flight,
                    "dropped_records": st.dropped,
                    "open_connections": st.open_connections,
                }
            self._send_json(200, out)
        elif name == "ids":
            need("GET")
            p = q.get("path")
            ok = q.get("ok", "") not in ("", "0", "false")
            with st.lock:
                if ok:
                    out = dict(st.ok_ids if p is None else st.ok_ids_by_path.get(p, {}))
                else:
                    out = dict(st.ids if p is None else st.ids_by_path.get(p, {}))
            self._send_json(200, out)
        elif name == "wait":
            need("GET")
            want = qint("count", 1)
            p = q.get("path")
            try:
                timeout = min(float(q.get("timeout") or 10), 600.0)
            except ValueError:
                raise BadRequest(400, "timeout must be a number")
            deadline = time.monotonic() + timeout
            with st.cond:
                while st.count(p) < want:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    st.cond.wait(left)
                n = st.count(p)
            self._send_json(200, {"ok": n >= want, "count": n})
        elif name == "scripts":
            need("GET")
            with st.lock:
                out = {p: s.cfg for p, s in st.scripts.items()}
            self._send_json(200, out)
        elif name == "health":
            need("GET")
            self._send_json(200, {"ok": True, "pid": os.getpid(), "port": self.server.server_address[1]})
        elif name == "shutdown":
            need("POST")
            self._send_json(200, {"ok": True}, close=True)
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        else:
            raise BadRequest(404, "unknown control endpoint /_control/%s" % name)


class SinkServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, addr, state, verbose=False):
        self.state = state
        self.verbose = verbose
        self.stopping = False
        self.rx_stamps = False
        super().__init__(addr, Handler)

    def server_bind(self):
        # HTTPServer.server_bind() calls getfqdn(), which may hit DNS; skip it.
        socketserver.TCPServer.server_bind(self)
        self.rx_stamps = enable_rx_stamps(self.socket)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, QUIET_ERRORS) and not self.verbose:
            return
        super().handle_error(request, client_address)


def write_port_file(path, port):
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description="scriptable HTTP sink for tests")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--log", help="append every recorded request as a JSON line")
    ap.add_argument("--max-records", type=int, default=0,
                    help="keep at most ~N (between N and 2N) recorded requests in memory; "
                         "counters and --log stay complete (default: unlimited)")
    ap.add_argument("--watch-pid", type=int, help="exit when this process is gone")
    ap.add_argument("--verbose", action="store_true", help="access log and tracebacks on stderr")
    args = ap.parse_args()

    state = State(args.log, args.max_records)
    server = SinkServer((args.host, args.port), state, verbose=args.verbose)
    port = server.server_address[1]

    def stop(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    except (AttributeError, ValueError):
        pass

    if args.watch_pid:
        def watch():
            while True:
                time.sleep(0.5)
                try:
                    os.kill(args.watch_pid, 0)
                except ProcessLookupError:
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                except PermissionError:
                    pass

        threading.Thread(target=watch, daemon=True).start()

    if args.port_file:
        write_port_file(args.port_file, port)
    if args.verbose:
        sys.stderr.write("sink: listening on %s:%d\n" % (args.host, port))
    try:
        server.serve_forever(poll_interval=0.2)
    except SystemExit:
        pass
    finally:
        server.stopping = True
        try:
            server.server_close()
        except OSError:
            pass
        if args.port_file:
            try:
                os.unlink(args.port_file)
            except OSError:
                pass
        if state.log is not None:
            with state.lock:
                try:
                    state.log.close()
                except OSError:
                    pass


if __name__ == "__main__":
    main()
