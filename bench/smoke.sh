#!/usr/bin/env bash
# Smoke run of `baton-bench mock-model`, `load` and `memory` (ctest bench_tools_smoke), so that the
# tools cannot rot: a real daemon whose model is the mock (streamed, with the clock tool, so each
# turn is a tool call and then a text answer), 200 turns of load, then a small memory run.
# Not a timed test. Usage: bench/smoke.sh BATON_BENCH BATON_CLI
set -euo pipefail
bench=$1
cli=$2
. "$(dirname "$0")/common.sh"

fail() {
    echo "bench smoke: $*" >&2
    for f in "$work"/*.out "$work"/*.log; do
        [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
    done
    exit 1
}

# The URL a process prints as `listening on http://HOST:PORT`, waiting at most 20 s.
wait_url() {
    timeout 20 bash -c "until grep -q '^listening on ' '$1'; do sleep 0.05; done" ||
        fail "no 'listening on' line in $1"
    sed -n 's/^listening on //p' "$1" | head -1
}

# Waits at most 15 s for a process started here to exit; returns its exit status.
wait_exit() {
    local i
    for i in $(seq 300); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.05
    done
    kill -0 "$1" 2>/dev/null && fail "process $1 did not stop"
    local rc=0
    wait "$1" || rc=$?
    return $rc
}

# The integer value of "key" in a one-line JSON object.
json_int() { sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p" <<<"$2"; }

"$bench" mock-model --listen 127.0.0.1:0 >"$work/mock.out" 2>&1 &
mock_pid=$!
pids+=("$mock_pid")
mock_url=$(wait_url "$work/mock.out")

cat >"$work/baton.json" <<EOF
{"agents": {"default": {"model": {"provider": "openai", "base_url": "$mock_url/v1", "model": "mock",
                                   "stream": true, "timeout_ms": 10000},
                        "tools": ["clock"]}}}
EOF
"$cli" check-config "$work/baton.json" >/dev/null || fail "config rejected"
"$cli" serve --config "$work/baton.json" --listen 127.0.0.1:0 --data "$work/data" \
    >"$work/daemon.out" 2>"$work/daemon.log" &
daemon_pid=$!
pids+=("$daemon_pid")
url=$(wait_url "$work/daemon.out")

# load exits 1 when any turn failed, 2 on misuse.
timeout 60 "$bench" load --url "$url" --turns 200 --clients 8 --pid "$daemon_pid" >"$work/load.out" ||
    fail "load failed"
cat "$work/load.out"
last=$(tail -1 "$work/load.out")
turns=$(json_int turns "$last")
[ "${turns:-0}" -ge 200 ] || fail "load: expected >= 200 turns: $last"
[ "$(json_int errors "$last")" = 0 ] || fail "load: errors: $last"
# The held forms: long poll (GET ?wait=) and the synchronous POST (?wait=).
for mode in longpoll sync; do
    timeout 60 "$bench" load --url "$url" --turns 100 --clients 8 --mode "$mode" >"$work/load-$mode.out" ||
        fail "load --mode $mode failed"
    last=$(tail -1 "$work/load-$mode.out")
    [ "$(json_int turns "$last")" -ge 100 ] || fail "load --mode $mode: expected >= 100 turns: $last"
    [ "$(json_int errors "$last")" = 0 ] || fail "load --mode $mode: errors: $last"
done

kill -TERM "$daemon_pid"
wait_exit "$daemon_pid" || fail "the daemon exited with $?"
kill -TERM "$mock_pid"
wait_exit "$mock_pid" || fail "mock-model exited with $?"
pids=()
mock_last=$(tail -1 "$work/mock.out")
echo "$mock_last"
# Two model calls a turn: the clock tool call, then the text answer.
[ "$(json_int requests "$mock_last")" -ge 400 ] || fail "mock-model: too few requests: $mock_last"
[ "$(json_int errors "$mock_last")" = 0 ] || fail "mock-model: errors: $mock_last"

timeout 60 "$bench" memory --baton "$cli" --sessions 300 --connections 10 --settle-ms 200 \
    >"$work/memory.out" || fail "memory failed"
cat "$work/memory.out"
last=$(tail -1 "$work/memory.out")
[ "$(json_int sessions "$last")" = 300 ] || fail "memory: $last"
grep -q '"rss_per_session_bytes":' <<<"$last" || fail "memory: no rss_per_session_bytes: $last"
echo "bench smoke: ok"
