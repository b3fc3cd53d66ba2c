# Sourced by bench/smoke.sh and bench/compare.sh: a scratch directory, the processes started
# here (ended by their id at exit), and the URL a process prints when it is ready.
work=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
