// What the benchmarks measure besides wall time: percentiles, a process's CPU time and memory from
// /proc, this process's own CPU time.
#pragma once

#include <cstdint>
#include <vector>

namespace baton::bench {

struct proc_sample {
    bool ok = false;          // the process existed and /proc could be read
    std::uint64_t cpu_us = 0; // utime + stime
    double rss_mb = 0;        // VmRSS
    double hwm_mb = 0;        // VmHWM: peak RSS
    std::uint64_t rss_bytes = 0;
};

// /proc/PID/stat and /proc/PID/status of another process (Linux).
proc_sample read_proc(int pid);

// This process's CPU time, every thread, user + system, in µs (CLOCK_PROCESS_CPUTIME_ID: fine
// enough to time a single turn of a few µs).
double self_cpu_us();

// Latencies in ms: sorts `v` and takes nearest-rank percentiles (all 0 when `v` is empty).
struct latency {
    double p50 = 0, p90 = 0, p99 = 0, max = 0;
};
latency summarize(std::vector<double>& v);

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.
std::uint64_t raise_fd_limit();

} // namespace baton::bench
