#!/usr/bin/env bash
# Self-test of test/sink/sink.py: starts a sink on a free loopback port,
# exercises every scripted mode with curl, checks the control API, stops it.
# Prints "sink selftest: ok" or "sink selftest: FAILED: <why>" (exit 1).
# Needs only bash, curl and /usr/bin/python3.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
DIR=$(mktemp -d /tmp/sink_selftest.XXXXXX)
SINK_PID=

cleanup() {
    if [ -n "$SINK_PID" ] && kill -0 "$SINK_PID" 2>/dev/null; then
        kill "$SINK_PID" 2>/dev/null
        wait "$SINK_PID" 2>/dev/null
    fi
    rm -rf "$DIR"
}
trap cleanup EXIT

fail() {
    echo "sink selftest: FAILED: $*" >&2
    if [ -s "$DIR/sink.err" ]; then echo "--- sink stderr:" >&2; cat "$DIR/sink.err" >&2; fi
    exit 1
}

# curl that never goes through a proxy and never retries
C() { curl -sS --noproxy '*' "$@"; }

"$PY" "$HERE/sink.py" --port 0 --port-file "$DIR/port" --log "$DIR/requests.jsonl" \
    --watch-pid $$ >"$DIR/sink.out" 2>"$DIR/sink.err" &
SINK_PID=$!
for _ in $(seq 100); do
    [ -s "$DIR/port" ] && break
    kill -0 "$SINK_PID" 2>/dev/null || fail "sink exited at start"
    sleep 0.1
done
[ -s "$DIR/port" ] || fail "no port file after 10 s"
PORT=$(cat "$DIR/port")
U="http://127.0.0.1:$PORT"

ctl_post() { C -X POST -H 'Content-Type: application/json' --data-binary "$2" "$U/_control/$1"; }
ctl_get()  { C "$U/_control/$1"; }
script()   { ctl_post script "$1" >/dev/null || fail "script $1"; }
# jq-like check with python: pyjson '<json>' '<python expression over j>'
pyjson() { printf '%s' "$1" | "$PY" -c 'import json,sys; j=json.load(sys.stdin); print(eval(sys.argv[1]))' "$2"; }
eq() { [ "$1" = "$2" ] || fail "$3: expected [$2], got [$1]"; }

post() {  # path key -> prints http code
    C -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $2" -d '{"k":"'"$2"'"}' "$U$1"
}

# ---- default answer, headers, keep-alive -------------------------------------
out=$(C -i -X POST -H 'Content-Type: application/json' -H 'Idempotency-Key: m-1' \
      -H 'ce-specversion: 1.0' -H 'ce-id: m-1' -H 'ce-type: order.created' \
      -H 'X-Outbox-Attempt: 1' -H 'webhook-id: m-1' -H 'webhook-timestamp: 1700000000' \
      -H 'webhook-signature: v1,abc=' -d '{"order":1,"name":"caf\u00e9"}' "$U/hook?x=1") \
    || fail "default request"
grep -q '^HTTP/1.1 200' <<<"$out" || fail "default status: $out"
grep -qi '^Content-Length: 2' <<<"$out" || fail "default Content-Length: $out"
[[ "$out" == *$'\r\n\r\n{}' ]] || fail "default body: $out"

# two transfers on one command line: the second must reuse the connection
conns=$(C -o /dev/null -o /dev/null -w '%{num_connects} ' -d '{}' "$U/ka" "$U/ka") || fail "keep-alive"
eq "$conns" "1 0 " "keep-alive connection reuse (num_connects)"

reqs=$(ctl_get 'requests?path=/hook') || fail "requests"
eq "$(pyjson "$reqs" 'len(j)')" 1 "requests?path=/hook count"
eq "$(pyjson "$reqs" 'j[0]["headers"]["Idempotency-Key"]')" m-1 "recorded Idempotency-Key"
eq "$(pyjson "$reqs" 'j[0]["headers_lc"]["idempotency-key"]')" m-1 "recorded headers_lc"
eq "$(pyjson "$reqs" 'j[0]["headers"]["ce-type"]')" order.created "recorded ce-type"
eq "$(pyjson "$reqs" 'j[0]["headers_lc"]["x-outbox-attempt"]')" 1 "recorded X-Outbox-Attempt"
eq "$(pyjson "$reqs" 'j[0]["headers"]["webhook-signature"]')" 'v1,abc=' "recorded webhook-signature"
eq "$(pyjson "$reqs" 'j[0]["body"]')" '{"order":1,"name":"caf\u00e9"}' "recorded body"
eq "$(pyjson "$reqs" 'j[0]["method"], j[0]["path"], j[0]["query"], j[0]["status"], j[0]["seq"]')" \
   "('POST', '/hook', 'x=1', 200, 1)" "recorded method/path/query/status/seq"
eq "$(pyjson "$reqs" 'isinstance(j[0]["t"], float) and abs(j[0]["t"] - __import__("time").time()) < 60')" \
   True "recorded t"
# Linux: the kernel's receive time of the request, on the same clock, no later than t
eq "$(pyjson "$reqs" 'isinstance(j[0]["t_rx"], float) and 0 <= j[0]["t"] - j[0]["t_rx"] < 5')" \
   True "recorded t_rx"

# ---- status + retry_after ------------------------------------------------------
script '{"path":"/s500","status":500,"retry_after":"7"}'
eq "$(C -o /dev/null -w '%{http_code} %header{retry-after}' -d '{}' "$U/s500")" "500 7" "status 500 + Retry-After"
script '{"path":"/s201","status":201,"retry_after":"7","body":"created"}'
eq "$(C -w ' %{http_code} [%header{retry-after}]' -d '{}' "$U/s201")" "created 201 []" "2xx has no Retry-After"
script '{"path":"/s204","status":204}'
eq "$(C -o /dev/null -w '%{http_code} %{size_download}' -d '{}' "$U/s204")" "204 0" "204 without body"

# ---- delay ---------------------------------------------------------------------
script '{"path":"/slow","delay_ms":400}'
t=$(C -o /dev/null -w '%{http_code} %{time_total}' -d '{}' "$U/slow") || fail "delay request"
eq "${t%% *}" 200 "delay status"
"$PY" -c "import sys; sys.exit(0 if float('${t#* }') >= 0.39 else 1)" || fail "delay_ms 400 answered after ${t#* } s"

# ---- fail_first per Idempotency-Key -------------------------------------------
script '{"path":"/ff","fail_first":2,"fail_status":503,"retry_after":"1"}'
codes="$(post /ff A) $(post /ff A) $(post /ff B) $(post /ff A) $(post /ff B) $(post /ff B) $(post /ff B)"
eq "$codes" "503 503 503 200 503 200 200" "fail_first=2 per key"
eq "$(C -o /dev/null -w '%header{retry-after}' -H 'Idempotency-Key: C' -d '{}' "$U/ff")" 1 "Retry-After on fail response"
ids=$(ctl_get 'ids?path=/ff') || fail "ids"
eq "$(pyjson "$ids" 'sorted(j.items())')" "[('A', 3), ('B', 4), ('C', 1)]" "ids?path=/ff"
# re-scripting restarts the counting
script '{"path":"/ff","fail_first":1,"fail_status":429}'
eq "$(post /ff A) $(post /ff A)" "429 200" "fail_first restarts after re-script"

# ---- redirect ------------------------------------------------------------------
script '{"path":"/redir","status":302,"location":"http://127.0.0.1:9/elsewhere"}'
eq "$(C -o /dev/null -w '%{http_code} %{redirect_url}' -d '{}' "$U/redir")" \
   "302 http://127.0.0.1:9/elsewhere" "302 + Location"

# ---- hang: curl gives up after 1 s ---------------------------------------------
script '{"path":"/hang","mode":"hang"}'
start=$(date +%s.%N)
C -o /dev/null --max-time 1 -d '{}' "$U/hang" 2>/dev/null; rc=$?
end=$(date +%s.%N)
eq "$rc" 28 "hang: curl exit code (timeout)"
"$PY" -c "import sys; sys.exit(0 if 0.9 <= $end - $start < 3 else 1)" || fail "hang took $(echo "$end - $start" | bc 2>/dev/null)"
reqs=$(ctl_get 'requests?path=/hang')
eq "$(pyjson "$reqs" '[r["status"] for r in j]')" "[None]" "hang recorded with status null"

# ---- close / reset / close_mid_response ----------------------------------------
script '{"path":"/close","mode":"close"}'
C -o /dev/null --max-time 5 -d '{}' "$U/close" 2>/dev/null; rc=$?
eq "$rc" 52 "close: curl exit code (empty reply)"
script '{"path":"/rst","mode":"reset"}'
C -o /dev/null --max-time 5 -d '{}' "$U/rst" 2>/dev/null; rc=$?
eq "$rc" 56 "reset: curl exit code (recv failure)"
script '{"path":"/mid","mode":"close_mid_response","status":200}'
C -o "$DIR/mid.out" --max-time 5 -d '{}' "$U/mid" 2>/dev/null; rc=$?
eq "$rc" 18 "close_mid_response: curl exit code (partial file)"
[ -s "$DIR/mid.out" ] || fail "close_mid_response sent no partial body"

# ---- huge_body -----------------------------------------------------------------
script '{"path":"/big","mode":"huge_body"}'
eq "$(C -o /dev/null --max-time 20 -w '%{http_code} %{size_download}' -d '{}' "$U/big")" \
   "200 8388608" "huge_body default 8 MiB"
script '{"path":"/big2","mode":"huge_body","body_bytes":1000001,"status":500}'
eq "$(C -o /dev/null --max-time 20 -w '%{http_code} %{size_download}' -d '{}' "$U/big2")" \
   "500 1000001" "huge_body body_bytes"
# client aborts while the body streams: the sink must shrug it off
C -o /dev/null --max-time 5 --max-filesize 1000 -d '{}' "$U/big" 2>/dev/null
C "$U/big" -d '{}' 2>/dev/null | head -c 100 >/dev/null

# ---- request body framing: chunked, Expect: 100-continue, HEAD, GET ------------
C -o /dev/null -H 'Transfer-Encoding: chunked' -d '{"chunked":true}' "$U/framing" || fail "chunked"
"$PY" -c 'print("{\"pad\":\"" + "y"*300000 + "\"}", end="")' >"$DIR/big.json"
C -o /dev/null -H 'Expect: 100-continue' --data-binary @"$DIR/big.json" "$U/framing" || fail "expect 100-continue"
eq "$(C -o /dev/null -w '%{http_code}' -I "$U/framing")" 200 "HEAD"
eq "$(C -w '%{http_code}' "$U/framing")" "{}200" "GET"
reqs=$(ctl_get 'requests?path=/framing')
eq "$(pyjson "$reqs" '[r["body"][:16] for r in j] + [len(j[1]["body"])]')" \
   "['{\"chunked\":true}', '{\"pad\":\"yyyyyyyy', '', '', 300010]" "framed bodies recorded"

# ---- sink still healthy after all the abuse ------------------------------------
eq "$(pyjson "$(ctl_get health)" 'j["ok"]')" True "health"
bad=$(C -w ' %{http_code}' -d '{"path":"/x","mode":"bogus"}' "$U/_control/script")
eq "${bad##* }" 400 "invalid script rejected"

# ---- stats, wait, log ----------------------------------------------------------
stats=$(ctl_get stats) || fail "stats"
# non-control requests sent above: 1 hook + 2 ka + 3 status + 1 slow + 8 ff + 2 ff
# + 1 redir + 1 hang + 3 close/rst/mid + 4 big + 4 framing = 30
eq "$(pyjson "$stats" 'j["total"]')" 30 "stats total"
eq "$(pyjson "$stats" 'j["by_path"]["/ff"], j["by_path"]["/hook"], j["by_path"]["/big"]')" "(10, 1, 3)" "stats by_path"
# keyed requests: m-1, 10x /ff with keys A(5) B(4) C(1) -> 11 keyed, 4 distinct, 7 duplicates
eq "$(pyjson "$stats" 'j["distinct_ids"], j["duplicates"]')" "(4, 7)" "stats distinct_ids/duplicates"
eq "$(pyjson "$(ctl_get 'stats?path=/ff')" 'j["distinct_ids"], j["duplicates"]')" "(3, 7)" "stats?path=/ff"
eq "$(pyjson "$(ctl_get 'wait?count=30&timeout=2')" 'j["ok"], j["count"]')" "(True, 30)" "wait satisfied"
eq "$(pyjson "$(ctl_get 'wait?count=31&timeout=0.3')" 'j["ok"]')" False "wait times out"
eq "$(wc -l <"$DIR/requests.jsonl")" 30 "log file lines"
eq "$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["headers"]["ce-id"])' "$DIR/requests.jsonl")" \
   m-1 "log line content"

# ---- fail_mode: first attempt per key times out / is dropped, then success -------
script '{"path":"/fm","fail_first":1,"fail_mode":"hang"}'
C -o /dev/null --max-time 1 -H 'Idempotency-Key: F' -d '{}' "$U/fm" 2>/dev/null; rc=$?
eq "$rc" 28 "fail_mode hang: first attempt times out"
eq "$(post /fm F)" 200 "fail_mode hang: second attempt succeeds"
script '{"path":"/fm2","fail_first":1,"fail_mode":"close","status":201}'
C -o /dev/null --max-time 5 -H 'Idempotency-Key: G' -d '{}' "$U/fm2" 2>/dev/null; rc=$?
eq "$rc" 52 "fail_mode close: first attempt gets no reply"
eq "$(post /fm2 G)" 201 "fail_mode close: second attempt succeeds"
eq "$(pyjson "$(ctl_get 'requests?path=/fm2')" '[r["status"] for r in j]')" "[None, 201]" "fail_mode statuses recorded"

# ---- reset ---------------------------------------------------------------------
ctl_post reset '{}' >/dev/null || fail "reset"
eq "$(pyjson "$(ctl_get stats)" 'j["total"], j["distinct_ids"]')" "(0, 0)" "stats after reset"
eq "$(C -o /dev/null -w '%{http_code}' -d '{}' "$U/s500")" 200 "scripts cleared by reset"
eq "$(pyjson "$(ctl_get requests)" '[r["seq"] for r in j]')" "[1]" "seq restarts after reset"

# ---- body_seq: %SEQ% in the body becomes the request's seq ----------------------
script '{"path":"/tok","body_seq":true,"body":"{\"access_token\":\"t-%SEQ%\"}"}'
b1=$(C -d 'grant_type=client_credentials' "$U/tok"); b2=$(C -d 'grant_type=client_credentials' "$U/tok")
[ "$b1" != "$b2" ] && grep -q '"t-[0-9]*"' <<<"$b1" || fail "body_seq: $b1 / $b2"
eq "$(C -o /dev/null -w '%{http_code}' -d '{"path":"/x","body_seq":"maybe"}' "$U/_control/script")" 400 "body_seq must be a boolean"

# ---- fail_ratio / delay_ratio / seed (random failure modes) --------------------
# everything fails at ratio 1 (with Retry-After, like a fail_first failure)
script '{"path":"/r1","fail_ratio":1,"fail_status":429,"retry_after":"2"}'
eq "$(C -o /dev/null -w '%{http_code} %header{retry-after}' -H 'Idempotency-Key: R' -d '{}' "$U/r1")" \
   "429 2" "fail_ratio 1: fail_status + Retry-After"
eq "$(post /r1 R)" 429 "fail_ratio 1: every request fails"
# default fail_status is 503; ratio 0 never fails
script '{"path":"/r0","fail_ratio":0,"delay_ratio":0,"seed":1}'
eq "$(post /r0 R) $(post /r0 R)" "200 200" "fail_ratio 0 never fails"
# seeded: the n-th request of the script gets the decision of the n-th draw pair
# of random.Random(seed) (fail first, then delay) -- the same in every run
expect=$("$PY" -c 'import random
r = random.Random(42); out = []
for _ in range(40):
    f = r.random(); r.random(); out.append("503" if f < 0.3 else "200")
print(" ".join(out))')
script '{"path":"/rs","fail_ratio":0.3,"seed":42}'
got=$(for i in $(seq 40); do printf '%s ' "$(post /rs "k$i")"; done)
eq "${got% }" "$expect" "fail_ratio 0.3 seed 42: deterministic sequence"
nfail=$(grep -o 503 <<<"$got" | wc -l)
[ "$nfail" -ge 4 ] && [ "$nfail" -le 24 ] || fail "fail_ratio 0.3: $nfail of 40 failed"
# re-scripting with the same seed replays the same decisions
script '{"path":"/rs","fail_ratio":0.3,"seed":42}'
got2=$(for i in $(seq 40); do printf '%s ' "$(post /rs "k$i")"; done)
eq "${got2% }" "$expect" "same seed after re-script: same sequence"
# fail_first takes precedence; fail_ratio applies to the requests it lets through
script '{"path":"/rf","fail_first":1,"fail_ratio":1,"fail_status":500}'
eq "$(post /rf Q) $(post /rf Q)" "500 500" "fail_first + fail_ratio"
# fail_mode is used for random failures too
script '{"path":"/rm","fail_ratio":1,"fail_mode":"close"}'
C -o /dev/null --max-time 5 -d '{}' "$U/rm" 2>/dev/null; rc=$?
eq "$rc" 52 "fail_ratio with fail_mode close"
# delay_ratio 1: every request waits delay_ratio_ms (on top of delay_ms)
script '{"path":"/rd","delay_ratio":1,"delay_ratio_ms":300,"delay_ms":100}'
t=$(C -o /dev/null -w '%{http_code} %{time_total}' -H 'Idempotency-Key: D' -d '{}' "$U/rd")
eq "${t%% *}" 200 "delay_ratio status"
"$PY" -c "import sys; sys.exit(0 if float('${t#* }') >= 0.39 else 1)" || fail "delay_ratio 1 + delay_ms answered after ${t#* } s"
# seeded delay_ratio: which requests were delayed is predictable (second draw of each pair)
dexpect=$("$PY" -c 'import random
r = random.Random(7); n = 0
for _ in range(20):
    r.random(); n += r.random() < 0.25
print(n)')
before=$(pyjson "$(ctl_get stats)" 'j["random_delays"]')
script '{"path":"/rds","delay_ratio":0.25,"delay_ratio_ms":20,"seed":7}'
for i in $(seq 20); do post /rds "d$i" >/dev/null; done
after=$(pyjson "$(ctl_get stats)" 'j["random_delays"]')
eq "$((after - before))" "$dexpect" "delay_ratio 0.25 seed 7: delayed count"
script '{"path":"/rds","delay_ratio":1,"delay_ratio_ms":20}'
post /rds dd >/dev/null
eq "$(pyjson "$(ctl_get stats)" 'j["random_delays"]')" "$((after + 1))" "random_delays counter"
# invalid values are rejected
for bad in '{"path":"/x","fail_ratio":1.5}' '{"path":"/x","delay_ratio":-0.1}' \
           '{"path":"/x","delay_ratio_ms":-1}' '{"path":"/x","seed":"abc"}' \
           '{"path":"/x","seed":1.5}' '{"path":"/x","fail_ratio":true}'; do
    code=$(C -o /dev/null -w '%{http_code}' -d "$bad" "$U/_control/script")
    eq "$code" 400 "invalid script rejected: $bad"
done
# "0.5" strings are tolerated like other numeric fields (Perl scalars)
eq "$(pyjson "$(ctl_post script '{"path":"/x","fail_ratio":"0.5","seed":"3"}')" 'j["script"]["fail_ratio"], j["script"]["seed"]')" \
   "(0.5, 3)" "string ratio/seed accepted"

# ---- 2xx-only id figures: ok_distinct_ids / ok_duplicates / ids?ok=1 ------------
ctl_post reset '{}' >/dev/null || fail "reset"
script '{"path":"/ok","fail_first":1}'
post /ok A >/dev/null; post /ok A >/dev/null; post /ok A >/dev/null; post /ok B >/dev/null
st=$(ctl_get 'stats?path=/ok')
eq "$(pyjson "$st" 'j["distinct_ids"], j["duplicates"], j["ok_distinct_ids"], j["ok_duplicates"]')" \
   "(2, 2, 1, 1)" "stats 2xx-only id figures"
eq "$(pyjson "$(ctl_get stats)" 'j["ok_distinct_ids"], j["ok_duplicates"]')" "(1, 1)" "global 2xx-only id figures"
eq "$(pyjson "$(ctl_get 'ids?path=/ok&ok=1')" 'sorted(j.items())')" "[('A', 2)]" "ids?ok=1"
eq "$(pyjson "$(ctl_get 'ids?ok=1')" 'sorted(j.items())')" "[('A', 2)]" "ids?ok=1 (all paths)"
eq "$(pyjson "$(ctl_get 'ids?path=/ok')" 'sorted(j.items())')" "[('A', 3), ('B', 1)]" "ids without ok=1 unchanged"

# ---- --max-records bounds memory, counters stay complete -----------------------
"$PY" "$HERE/sink.py" --port 0 --port-file "$DIR/port2" --max-records 5 --watch-pid $$ \
    >"$DIR/sink2.out" 2>"$DIR/sink2.err" &
SINK2_PID=$!
for _ in $(seq 100); do [ -s "$DIR/port2" ] && break; sleep 0.1; done
U2="http://127.0.0.1:$(cat "$DIR/port2")"
for i in $(seq 23); do C -o /dev/null -H "Idempotency-Key: m$i" -d '{}' "$U2/mr"; done
st=$(C "$U2/_control/stats")
eq "$(pyjson "$st" 'j["total"], j["distinct_ids"], j["dropped_records"]')" "(23, 23, 15)" "max-records: stats complete, records dropped"
eq "$(pyjson "$(C "$U2/_control/requests")" '[r["seq"] for r in j]')" "[16, 17, 18, 19, 20, 21, 22, 23]" "max-records: recent requests kept"
eq "$(pyjson "$(C "$U2/_control/ids")" 'len(j)')" 23 "max-records: ids complete"
kill "$SINK2_PID"; wait "$SINK2_PID" 2>/dev/null
[ -s "$DIR/sink2.err" ] && fail "second sink wrote to stderr: $(cat "$DIR/sink2.err")"

# ---- stop ----------------------------------------------------------------------
kill "$SINK_PID"
for _ in $(seq 50); do kill -0 "$SINK_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$SINK_PID" 2>/dev/null && fail "sink did not stop on SIGTERM"
wait "$SINK_PID" 2>/dev/null
SINK_PID=
[ -e "$DIR/port" ] && fail "port file left behind"
[ -s "$DIR/sink.err" ] && fail "sink wrote to stderr"
echo "sink selftest: ok"
