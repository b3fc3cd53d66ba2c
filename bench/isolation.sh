#!/usr/bin/env bash
# One tenant at its limit never slows another: tenant B's turn latency alone, and while tenant A
# floods the daemon past its turns_per_minute (most of A's messages answered 429 rate_limited),
# alternated ROUNDS times in one sitting. One daemon (SQLite, a streamed mock model, bearer tokens
# of both tenants; a context window of 4096 tokens, so that B's sessions stay at their budget and
# later rounds do not pay for a longer history); the same load generator for both
# (baton-bench load --token).
# Usage: bench/isolation.sh [BUILD_DIR] [ROUNDS]   (BUILD_DIR holds baton and baton-bench; build/)
set -euo pipefail
dir=${1:-build}
rounds=${2:-3}
. "$(dirname "$0")/common.sh"

"$dir/baton-bench" mock-model --listen 127.0.0.1:0 >"$work/mock.out" 2>&1 &
pids+=($!)
mock_url=$(wait_url "$work/mock.out")
a=$("$dir/baton" token new --tenant a)
b=$("$dir/baton" token new --tenant b)
token_a=$(head -1 <<<"$a")
token_b=$(head -1 <<<"$b")
cat >"$work/baton.json" <<JSON
{"server": {"tokens": [$(sed -n 2p <<<"$a"), $(sed -n 2p <<<"$b")]},
 "tenants": {"a": {"limits": {"turns_per_minute": 60}}},
 "agents": {"default": {"model": {"provider": "openai", "base_url": "$mock_url/v1", "model": "mock",
                                  "stream": true, "timeout_ms": 10000, "context_window": 4096},
                        "context": {"reserve_output_tokens": 512}}}}
JSON
"$dir/baton" serve --config "$work/baton.json" --listen 127.0.0.1:0 --data "$work/data" \
    >"$work/d.out" 2>"$work/d.log" &
pids+=($!)
url=$(wait_url "$work/d.out")

b_load() { "$dir/baton-bench" load --url "$url" --token "$token_b" --clients 10 --seconds 8 --turns 1000000 | tail -1; }
for n in $(seq "$rounds"); do
    alone=$(b_load)
    echo "{\"round\":$n,\"b\":\"alone\",\"turns_per_s\":$(num turns_per_s "$alone"),\"p50_ms\":$(num p50_ms "$alone"),\"p99_ms\":$(num p99_ms "$alone"),\"errors\":$(num errors "$alone")}" | tee -a "$work/runs"
    # A: 20 clients as fast as they can, far past 60 turns a minute (the load generator pauses
    # 10 ms after each refusal, as a client honouring Retry-After would not).
    "$dir/baton-bench" load --url "$url" --token "$token_a" --clients 20 --seconds 12 --turns 100000000 \
        >"$work/a.out" 2>&1 &
    flood=$!
    sleep 2
    beside=$(b_load)
    wait "$flood" || true
    a_line=$(tail -1 "$work/a.out")
    refused=$(sed -n 's/.*"http_429_rate_limited":\([0-9]*\).*/\1/p' <<<"$a_line")
    echo "{\"round\":$n,\"b\":\"beside_a_flood\",\"turns_per_s\":$(num turns_per_s "$beside"),\"p50_ms\":$(num p50_ms "$beside"),\"p99_ms\":$(num p99_ms "$beside"),\"errors\":$(num errors "$beside"),\"a_turns\":$(num turns "$a_line"),\"a_refused_429\":${refused:-0}}" | tee -a "$work/runs"
done

summary() { median_line "\"b\":\"$1\"" "$2" 2 "B $1"; } # phase key
for k in turns_per_s p50_ms p99_ms; do
    summary alone $k
    summary beside_a_flood $k
done
