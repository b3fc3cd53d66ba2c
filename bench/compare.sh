#!/usr/bin/env bash
# Two builds side by side, alternated run by run in one sitting: the in-process pipeline (memory
# store, 2 threads) and the daemon end to end (a streamed mock model, 50 clients on 50 sessions,
# polling, SQLite). Prints one JSON line per run and a median / min-max summary per build.
# Usage: bench/compare.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS]
#   (each dir holds `baton` and `baton-bench`; e.g. build/ and a build of an older commit)
set -euo pipefail
old=$1
new=$2
rounds=${3:-5}
. "$(dirname "$0")/common.sh"

# The mock model is the same binary for both (the new build's), so that only baton differs.
start_mock "$new/baton-bench"

daemon_run() { # dir label round
    local dir=$1 label=$2 n=$3 data="$work/data-$2-$3"
    "$dir/baton" serve --config "$work/baton.json" --listen 127.0.0.1:0 --data "$data" \
        >"$work/d.out" 2>"$work/d.log" &
    local pid=$!
    local url
    url=$(wait_url "$work/d.out")
    local line
    line=$("$new/baton-bench" load --url "$url" --clients 50 --sessions 50 --turns 10000 --warmup 1000 \
        --pid "$pid" | tail -1)
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$data"
    echo "{\"build\":\"$label\",\"round\":$n,\"daemon_turns_per_s\":$(num turns_per_s "$line"),\"daemon_cpu_us_per_turn\":$(num cpu_us_per_turn "$line")}"
}
pipeline_run() { # dir label round
    local line
    line=$("$1/baton-bench" pipeline --seconds 3 --threads 2 --sessions 64 | tail -1)
    echo "{\"build\":\"$2\",\"round\":$3,\"pipeline_turns_per_s\":$(num turns_per_s "$line")}"
}

for n in $(seq "$rounds"); do
    # Alternated, and the order flips each round.
    if [ $((n % 2)) = 1 ]; then first=old; else first=new; fi
    for b in $first $([ $first = old ] && echo new || echo old); do
        dir=$([ $b = old ] && echo "$old" || echo "$new")
        pipeline_run "$dir" $b "$n" | tee -a "$work/runs"
        daemon_run "$dir" $b "$n" | tee -a "$work/runs"
    done
done

summary() { median_line "\"build\":\"$1\"" "$2" 0 "$1"; } # build key
for k in pipeline_turns_per_s daemon_turns_per_s daemon_cpu_us_per_turn; do
    summary old $k
    summary new $k
done
