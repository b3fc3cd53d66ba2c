#include "bench/measure.hpp"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace baton::bench {

proc_sample read_proc(int pid) {
    proc_sample s;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return s;
    // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
    auto close = line.rfind(')');
    if (close == std::string::npos) return s;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    std::uint64_t utime = 0, stime = 0;
    // Fields 3.. : state is field 3, utime field 14, stime field 15.
    for (int n = 3; n <= 15 && rest >> field; ++n) {
        if (n == 14) utime = std::stoull(field);
        if (n == 15) stime = std::stoull(field);
    }
    static const long ticks = sysconf(_SC_CLK_TCK);
    s.cpu_us = (utime + stime) * 1000000 / static_cast<std::uint64_t>(ticks > 0 ? ticks : 100);

    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    while (std::getline(status, line)) {
        auto kb = [&](std::string_view key) -> std::optional<std::uint64_t> {
            if (!line.starts_with(key)) return std::nullopt;
            return std::stoull(line.substr(key.size()));
        };
        if (auto v = kb("VmRSS:")) {
            s.rss_bytes = *v * 1024;
            s.rss_mb = static_cast<double>(*v) / 1024.0;
        }
        if (auto v = kb("VmHWM:")) s.hwm_mb = static_cast<double>(*v) / 1024.0;
    }
    s.ok = s.rss_bytes > 0;
    return s;
}

double self_cpu_us() {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

latency summarize(std::vector<double>& v) {
    latency l;
    if (v.empty()) return l;
    std::sort(v.begin(), v.end());
    // Nearest rank: the smallest value with at least q of the samples at or below it.
    auto at = [&](double q) {
        auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
        return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
    };
    l.p50 = at(0.50);
    l.p90 = at(0.90);
    l.p99 = at(0.99);
    l.max = v.back();
    return l;
}

std::uint64_t raise_fd_limit() {
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
    if (r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
        getrlimit(RLIMIT_NOFILE, &r);
    }
    return r.rlim_cur;
}

} // namespace baton::bench
