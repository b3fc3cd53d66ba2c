#!/usr/bin/env bash
# One sitting of issue 22's yardstick: ROUNDS rounds, each the nginx floor (bench/floor.sh) and
# then every mode of `baton-bench load` against a fresh `baton serve` and data directory (so that
# every run sees the same session lengths), in the order given, which rotates each round. The
# workload is issue 22's: a streamed `baton-bench mock-model`, 50 clients on 50 sessions, SQLite,
# WARMUP turns not measured, then TURNS measured. With LangGraph in MODES (`langgraph-poll`,
# `langgraph-join`) the peer of bench/peers/langgraph (in memory, a fresh server per run) runs in
# the same rounds, on the same mock and the same load generator, for PEER_WARMUP + PEER_TURNS runs
# (it is ~100 times slower; its threads are then shorter than baton's sessions, which favours it:
# its CPU per run grows with the thread).
# Exits 1 when a run failed (no result, or any turn in error): ctest's bench_sitting_smoke runs it
# briefly. Prints one JSON line per run and, last, a Markdown table: per system and mode the median and
# min-max of CPU per turn (µs), of nginx exchanges per turn (each run over its own round's nginx
# figure) and of turns/s.
# Usage: bench/sitting.sh [--rounds R] [--turns N] [--warmup W] [--modes "poll longpoll sync ws"]
#                         [--build DIR] [--threads T] [--peer-turns N] [--peer-warmup W]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 turns=6000 warmup=1000 modes="poll longpoll sync ws" build=$root/build threads=""
peer_turns=500 peer_warmup=50
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "bench/sitting.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --rounds) rounds=$2 ;;
        --turns) turns=$2 ;;
        --warmup) warmup=$2 ;;
        --modes) modes=$2 ;;
        --build) build=$2 ;;
        --threads) threads=$2 ;;
        --peer-turns) peer_turns=$2 ;;
        --peer-warmup) peer_warmup=$2 ;;
        *) echo "usage: bench/sitting.sh [--rounds R] [--turns N] [--warmup W] [--modes M] [--build DIR]" \
                "[--threads T] [--peer-turns N] [--peer-warmup W]" >&2
           exit 2 ;;
    esac
    shift 2
done
. "$root/bench/common.sh"
for m in $modes; do
    case "$m" in
        poll | longpoll | sync | sse | ws | langgraph-poll | langgraph-join) ;;
        *) echo "bench/sitting.sh: unknown mode $m" >&2; exit 2 ;;
    esac
done
case " $modes " in *" langgraph-"*) "$root/scripts/ensure-node" "$root/bench/peers/langgraph" ;; esac

start_mock "$build/baton-bench"

# Drives the server PID (which printed its URL into OUT) with MODE for W + N turns, stops it,
# removes DIR, and prints the load generator's JSON line.
load_and_stop() { # out pid mode turns warmup dir
    local url line
    url=$(wait_url "$1")
    line=$("$build/baton-bench" load --url "$url" --clients 50 --sessions 50 --turns "$4" \
        --warmup "$5" --mode "$3" --pid "$2" | tail -1)
    kill -TERM "$2"
    wait "$2" || true
    rm -rf "$6"
    echo "$line"
}
baton_run() { # mode round
    local data="$work/data-$1-$2"
    "$build/baton" serve --config "$work/baton.json" --listen 127.0.0.1:0 --data "$data" \
        ${threads:+--threads "$threads"} >"$work/d.out" 2>"$work/d.log" &
    load_and_stop "$work/d.out" $! "$1" "$turns" "$warmup" "$data"
}
langgraph_run() { # mode round
    local state="$work/lg-$2"
    mkdir -p "$state"
    node "$root/bench/peers/langgraph/server.mjs" --port 0 --model-url "$mock_url/v1" \
        --state-dir "$state" --persist 0 >"$work/lg.out" 2>"$work/lg.log" &
    load_and_stop "$work/lg.out" $! "$1" "$peer_turns" "$peer_warmup" "$state"
}

: >"$work/runs"
set -- $modes
for n in $(seq "$rounds"); do
    floor=$("$root/bench/floor.sh" 3 1 2>/dev/null | tail -1)
    nginx=$(num us_per_exchange "$floor")
    echo "{\"round\":$n,\"system\":\"nginx\",\"mode\":\"static\",\"cpu_us\":$nginx,\"units\":1,\"turns_per_s\":$(num requests_per_s "$floor")}" |
        tee -a "$work/runs"
    # Rotated: each round starts one mode later.
    order=("$@")
    shift_by=$(((n - 1) % $#))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for m in "${order[@]}"; do
        case "$m" in
            langgraph-*) line=$(langgraph_run "$m" "$n" || true); system=langgraph ;;
            *) line=$(baton_run "$m" "$n" || true); system=baton ;;
        esac
        if [ -z "$line" ] || [ "$(num errors "$line")" != 0 ]; then
            echo "bench/sitting.sh: the $system $m run of round $n failed: ${line:-no result}" >&2
            tail -20 "$work/d.log" "$work/lg.log" 2>/dev/null >&2 || true
            exit 1
        fi
        cpu=$(num cpu_us_per_turn "$line")
        units=$(awk -v c="$cpu" -v u="$nginx" 'BEGIN {printf "%.1f", c / u}')
        echo "{\"round\":$n,\"system\":\"$system\",\"mode\":\"$m\",\"cpu_us\":$cpu,\"units\":$units,\"turns_per_s\":$(num turns_per_s "$line"),\"errors\":$(num errors "$line"),\"load\":$line}" |
            tee -a "$work/runs"
    done
done

# The table: median (min-max) of each figure over the rounds.
stat() { # system mode key digits
    grep -F "\"system\":\"$1\",\"mode\":\"$2\"" "$work/runs" | sed -n "s/.*\"$3\":\([-0-9.eE+]*\).*/\1/p" |
        sort -g | awk -v d="$4" '{v[NR]=$1} END {if (!NR) {print "-"; exit}
            m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2
            printf("%." d "f (%." d "f–%." d "f)\n", m, v[1], v[NR])}'
}
echo
echo "| system | mode | µs CPU a turn | nginx exchanges a turn | turns/s |"
echo "|---|---|---|---|---|"
echo "| nginx | static 200 (µs an exchange; requests/s) | $(stat nginx static cpu_us 2) | 1 | $(stat nginx static turns_per_s 0) |"
for m in $modes; do
    case "$m" in langgraph-*) system=langgraph ;; *) system=baton ;; esac
    echo "| $system | $m | $(stat $system "$m" cpu_us 0) | $(stat $system "$m" units 1) | $(stat $system "$m" turns_per_s 0) |"
done
