#!/usr/bin/env bash
# Issue 23's scale-out figures: 1, 2 and 3 `baton serve` nodes (storage.postgres.cluster) on one
# PostgreSQL, all on this machine. A throwaway cluster (scripts/pg-cluster, durable: fsync on),
# the streamed `baton-bench mock-model`, and per node one `baton-bench load` in poll mode with
# CLIENTS/N clients on sessions of its own (a client stays on its node, as behind a load balancer
# with affinity), all started together; each run on a fresh schema. Per run: the turns/s of all
# nodes together, each node's CPU per turn, and PostgreSQL's CPU per turn (every process of the
# cluster, from /proc). ROUNDS rounds, the node counts rotating each round.
# Prints one JSON line per run and, last, a Markdown table of medians and min-max.
# Usage: bench/cluster.sh [--rounds R] [--turns N] [--warmup W] [--clients C] [--nodes "1 2 3"]
#                         [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 turns=6000 warmup=600 clients=48 node_counts="1 2 3" build=$root/build
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "bench/cluster.sh: $1 needs a value" >&2; exit 2; }
    case "$1" in
        --rounds) rounds=$2 ;;
        --turns) turns=$2 ;;
        --warmup) warmup=$2 ;;
        --clients) clients=$2 ;;
        --nodes) node_counts=$2 ;;
        --build) build=$2 ;;
        *) echo "usage: bench/cluster.sh [--rounds R] [--turns N] [--warmup W] [--clients C]" \
                "[--nodes \"1 2 3\"] [--build DIR]" >&2
           exit 2 ;;
    esac
    shift 2
done
. "$root/bench/common.sh"
"$root/scripts/install-deps" --postgres >&2
pg_dir=$work/pg
conninfo=$("$root/scripts/pg-cluster" start "$pg_dir" --durable)
stop_pg() { "$root/scripts/pg-cluster" stop "$pg_dir" >/dev/null 2>&1 || true; cleanup; }
trap stop_pg EXIT
psql_do() { psql -X -q -At "$conninfo" -c "$1"; }

start_mock "$build/baton-bench"

# utime + stime (µs) of every process of the PostgreSQL cluster: the postmaster and its children.
pg_cpu_us() {
    local pm tick=$(getconf CLK_TCK) total=0 p
    pm=$(head -1 "$pg_dir/data/postmaster.pid")
    for p in $pm $(pgrep -P "$pm" || true); do
        [ -r /proc/$p/stat ] || continue
        total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo $((total * 1000000 / tick))
}

# One run of N nodes: prints its JSON line.
run_nodes() { # n round
    local n=$1 schema="b$2_$1" i per=$((clients / $1)) node_pids=() outs=() lines=() urls=()
    psql_do "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" >/dev/null 2>&1
    cat >"$work/node.json" <<EOF
{"storage": {"postgres": {"conninfo": "$conninfo options='-csearch_path=$schema'", "pool_size": 4,
                          "cluster": true}},
 "agents": {"default": {"model": {"provider": "openai", "base_url": "$mock_url/v1", "model": "mock",
                                   "stream": true, "timeout_ms": 10000}}}}
EOF
    for ((i = 0; i < n; i++)); do
        "$build/baton" serve --listen 127.0.0.1:0 --config "$work/node.json" >"$work/node$i.out" \
            2>"$work/node$i.log" &
        node_pids+=($!)
        pids+=($!)
    done
    for ((i = 0; i < n; i++)); do urls+=("$(wait_url "$work/node$i.out")"); done
    # Warm-up: every node's clients, not measured.
    for ((i = 0; i < n; i++)); do
        "$build/baton-bench" load --url "${urls[$i]}" --clients "$per" --sessions "$per" \
            --session-prefix "n$i-" --turns $((warmup / n)) --mode poll >/dev/null 2>&1 &
        outs+=($!)
    done
    for p in "${outs[@]}"; do wait "$p" || true; done
    outs=()
    local pg0 t0 pg1 t1
    pg0=$(pg_cpu_us)
    t0=$(date +%s%N)
    for ((i = 0; i < n; i++)); do
        "$build/baton-bench" load --url "${urls[$i]}" --clients "$per" --sessions "$per" \
            --session-prefix "n$i-" --turns $((turns / n)) --mode poll --pid "${node_pids[$i]}" \
            >"$work/load$i.out" 2>&1 &
        outs+=($!)
    done
    local failed=0
    for p in "${outs[@]}"; do wait "$p" || failed=1; done
    t1=$(date +%s%N)
    pg1=$(pg_cpu_us)
    local done_turns=0 errors=0 cpu_sum=0 cpus="" line
    for ((i = 0; i < n; i++)); do
        line=$(tail -1 "$work/load$i.out")
        done_turns=$((done_turns + $(num turns "$line")))
        errors=$((errors + $(num errors "$line")))
        cpus="$cpus${cpus:+,}$(num cpu_us_per_turn "$line")"
    done
    for p in "${node_pids[@]}"; do kill -TERM "$p"; wait "$p" || true; done
    local secs tps pg_per cpu_node
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b - a) / 1e9}')
    tps=$(awk -v t="$done_turns" -v s="$secs" 'BEGIN {printf "%.0f", t / s}')
    pg_per=$(awk -v a="$pg0" -v b="$pg1" -v t="$done_turns" 'BEGIN {printf "%.1f", (b - a) / t}')
    cpu_node=$(awk -v l="$cpus" 'BEGIN {n = split(l, v, ","); s = 0; for (i = 1; i <= n; i++) s += v[i];
        printf "%.1f", s / n}')
    echo "{\"bench\":\"cluster\",\"nodes\":$n,\"round\":$2,\"turns\":$done_turns,\"errors\":$errors," \
         "\"seconds\":$secs,\"turns_per_s\":$tps,\"node_cpu_us_per_turn\":[$cpus]," \
         "\"node_cpu_us_per_turn_mean\":$cpu_node,\"pg_cpu_us_per_turn\":$pg_per}" | tr -d ' '
    psql_do "DROP SCHEMA $schema CASCADE" >/dev/null 2>&1 || true
    return $failed
}

: >"$work/runs"
status=0
order=($node_counts)
for ((r = 1; r <= rounds; r++)); do
    for n in "${order[@]}"; do
        line=$(run_nodes "$n" "$r") || status=1
        echo "$line"
        echo "$line" >>"$work/runs"
    done
    order=("${order[@]:1}" "${order[0]}")
done

echo
echo "| nodes | turns/s | CPU per turn per node (µs) | PostgreSQL CPU per turn (µs) |"
echo "|---|---|---|---|"
for n in $node_counts; do
    cell() { median_line "\"nodes\":$n," "$1" "$2" x | sed 's/.*median \([^ ]*\) (\([^,]*\), \([0-9]*\) runs)/\1 (\2)/'; }
    echo "| $n | $(cell turns_per_s 0) | $(cell node_cpu_us_per_turn_mean 0) | $(cell pg_cpu_us_per_turn 0) |"
done
exit $status
