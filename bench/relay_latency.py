#!/usr/bin/env python3
# How long a relayed turn event takes between two cluster nodes (issue 23): two `baton serve`
# nodes with storage.postgres.cluster on the PostgreSQL that BATON_PG names (a schema `lat`,
# dropped and made again), the `baton-bench mock-model` streaming 30 chunks 20 ms apart. Per
# round a session is made node A's (its first message), then a message sent to node B runs on A;
# an SSE reader on each node records when each model.delta arrives, and the relay latency is B's
# arrival minus A's. Prints one JSON line: p50, p90, p99 and max in ms over ROUNDS rounds (20).
# Usage: BATON_PG=conninfo bench/relay_latency.py [BUILD_DIR] [ROUNDS]
import json, os, re, shutil, socket, subprocess, sys, threading, time
B = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "build"))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
conninfo = os.environ["BATON_PG"]
scratch = subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip()
os.chdir(scratch)
subprocess.run(["psql", "-q", conninfo, "-c", "DROP SCHEMA IF EXISTS lat CASCADE; CREATE SCHEMA lat"], capture_output=True)
procs = []
def start(args, out):
    f = open(out, "w")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.DEVNULL)
    procs.append(p)
    for _ in range(200):
        time.sleep(0.05)
        m = re.search(r"listening on (http://\S+)", open(out).read())
        if m: return m.group(1)
    raise SystemExit("no url from " + out)
try:
    mock = start([B + "/baton-bench", "mock-model", "--delay-ms", "20", "--chunks", "30"], "mock.out")
    cfg = {"storage": {"postgres": {"conninfo": conninfo + " options='-csearch_path=lat'", "cluster": True}},
           "agents": {"default": {"model": {"provider": "openai", "base_url": mock + "/v1", "model": "m", "stream": True, "timeout_ms": 10000}}}}
    json.dump(cfg, open("c.json", "w"))
    a = start([B + "/baton", "serve", "--listen", "127.0.0.1:0", "--config", "c.json"], "a.out")
    b = start([B + "/baton", "serve", "--listen", "127.0.0.1:0", "--config", "c.json"], "b.out")
    def hp(u): h, p = u[7:].split(":"); return h, int(p)
    def post(u, sid, text, query=""):
        h, p = hp(u); s = socket.create_connection((h, p)); body = json.dumps({"text": text})
        s.sendall(f"POST /v1/sessions/{sid}/messages{query} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        data = b""
        while True:
            c = s.recv(65536)
            if not c: break
            data += c
        return json.loads(data.split(b"\r\n\r\n", 1)[1])
    lat = []
    for i in range(rounds):
        sid = f"L{i}"
        post(a, sid, "own", "?wait=20")  # a owns the session
        tid = post(b, sid, "again")["turn_id"]  # runs on a, accepted on b: relayed to b
        times = {}
        def follow(u, key):
            h, p = hp(u); s = socket.create_connection((h, p))
            s.sendall(f"GET /v1/turns/{tid}/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            buf = b""; seen = []
            while True:
                c = s.recv(65536)
                if not c: break
                now = time.monotonic()
                buf += c
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    t = re.search(rb"event: (\S+)", ev); d = re.search(rb"data: (.*)", ev)
                    if t and t.group(1) == b"model.delta": seen.append((d.group(1), now))
            times[key] = seen
        ta = threading.Thread(target=follow, args=(a, "a")); tb = threading.Thread(target=follow, args=(b, "b"))
        ta.start(); tb.start(); ta.join(30); tb.join(30)
        da = dict(times.get("a", [])); 
        for d, t in times.get("b", []):
            if d in da: lat.append((t - da[d]) * 1000)
    lat.sort()
    n = len(lat)
    print(json.dumps({"relayed_deltas": n, "p50_ms": round(lat[n // 2], 2), "p90_ms": round(lat[int(n * 0.9)], 2), "p99_ms": round(lat[int(n * 0.99)], 2), "max_ms": round(lat[-1], 2)}))
finally:
    for p in procs: p.terminate()
    for p in procs: p.wait()
    shutil.rmtree(scratch, ignore_errors=True)
