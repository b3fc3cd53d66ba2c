#!/usr/bin/env bash
# The yardstick of issue 22: the server CPU of one HTTP exchange at nginx's cost, on this machine,
# now. nginx from Debian with one worker, a static 200 and no logging, on a loopback port, driven
# by `wrk -t1 -c50` for SECONDS (default 5) ROUNDS times (default 3); the worker's CPU time
# (utime + stime from /proc) over the requests wrk made. Installs nginx and wrk when missing
# (apt-get), stops nginx at the end. Prints one line per round and, last, one JSON line:
#   {"bench":"floor","us_per_exchange":M,"min":A,"max":B,"rounds":N,"requests_per_s":R}
# Usage: bench/floor.sh [SECONDS] [ROUNDS]
set -euo pipefail
seconds=${1:-5}
rounds=${2:-3}
. "$(dirname "$0")/common.sh"

missing=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y "${missing[@]}" >&2
fi
nginx=$(command -v nginx || echo /usr/sbin/nginx)

# A free loopback port: bind 0 in Python, which the machine has (Debian's python3-minimal).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server {
        listen 127.0.0.1:$port;
        location / { default_type application/json; return 200 '{"status":"ok"}'; }
    }
}
EOF
"$nginx" -p "$work/nginx" -c "$work/nginx/nginx.conf" 2>"$work/nginx/stderr" &
pids+=($!)
for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$port/" >/dev/null 2>&1 && break
    sleep 0.05
done
master=$(cat "$work/nginx/nginx.pid")
worker=$(pgrep -P "$master" | head -1)
[ -n "$worker" ] || { echo "floor: no nginx worker" >&2; cat "$work/nginx/stderr" >&2; exit 1; }

ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
: >"$work/runs"
for r in $(seq "$rounds"); do
    before=$(cpu_ticks "$worker")
    out=$(wrk -t1 -c50 -d"${seconds}s" "http://127.0.0.1:$port/")
    after=$(cpu_ticks "$worker")
    requests=$(sed -n 's/^ *\([0-9][0-9]*\) requests in.*/\1/p' <<<"$out")
    rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' <<<"$out")
    us=$(awk -v t="$((after - before))" -v hz="$ticks" -v n="$requests" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}')
    echo "round $r: $requests requests, $rps/s, nginx worker $us us CPU an exchange"
    echo "{\"us_per_exchange\":$us,\"requests_per_s\":$rps}" >>"$work/runs"
done
line=$(median_line '"us' us_per_exchange 2 floor)
rps=$(median_line '"us' requests_per_s 0 floor)
echo "$line" >&2
med=$(sed -n 's/.*median \([0-9.]*\) (\([0-9.]*\)-\([0-9.]*\),.*/\1 \2 \3/p' <<<"$line")
rmed=$(sed -n 's/.*median \([0-9.]*\) .*/\1/p' <<<"$rps")
read -r m lo hi <<<"$med"
echo "{\"bench\":\"floor\",\"us_per_exchange\":$m,\"min\":$lo,\"max\":$hi,\"rounds\":$rounds,\"requests_per_s\":$rmed}"
