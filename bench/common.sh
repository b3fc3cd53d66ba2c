# Sourced by bench/smoke.sh, bench/compare.sh, bench/sitting.sh, bench/floor.sh and
# bench/isolation.sh: a scratch directory, the processes started here (ended by their id at exit),
# the URL a process prints when it is ready, and the mock model.
work=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# The URL after `listening on ` in FILE, once it is there (20 s at most).
wait_url() {
    timeout 20 bash -c "until grep -q '^listening on ' '$1'; do sleep 0.05; done"
    sed -n 's/^listening on //p' "$1" | head -1
}
# The number of "KEY": in a JSON line.
num() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p" <<<"$2" | head -1; }
# The median and min-max of KEY over the lines of $work/runs that hold FILTER (literally, e.g.
# "build":"old"), printed as `LABEL KEY: median M (MIN-MAX, N runs)` with DIGITS decimals.
median_line() { # filter key digits label
    grep -F "$1" "$work/runs" | sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" | sort -g |
        awk -v l="$4" -v k="$2" -v d="$3" '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
            f = "%s %s: median %." d "f (%." d "f-%." d "f, %d runs)\n"; printf f, l, k, m, v[1], v[NR], NR}'
}
# Starts BATON_BENCH's mock model (ended at exit), sets mock_url and writes $work/baton.json: a
# daemon config whose default agent calls the mock, streamed.
start_mock() { # baton_bench
    "$1" mock-model --listen 127.0.0.1:0 >"$work/mock.out" 2>&1 &
    pids+=($!)
    mock_url=$(wait_url "$work/mock.out")
    cat >"$work/baton.json" <<EOF
{"agents": {"default": {"model": {"provider": "openai", "base_url": "$mock_url/v1", "model": "mock",
                                   "stream": true, "timeout_ms": 10000}}}}
EOF
}
