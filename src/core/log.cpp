#include <baton/log.hpp>
#include <baton/types.hpp>

#include <boost/json/serialize.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace baton::log {

namespace {
level initial_level() {
    const char* v = std::getenv("BATON_LOG");
    if (!v) return level::info;
    if (!std::strcmp(v, "debug")) return level::debug;
    if (!std::strcmp(v, "warn")) return level::warn;
    if (!std::strcmp(v, "error")) return level::error;
    return level::info;
}

std::atomic<level> threshold{initial_level()};
std::mutex sink_mutex;
std::function<void(std::string_view)> sink;

constexpr std::string_view names[] = {"debug", "info", "warn", "error"};
} // namespace

bool enabled(level l) {
    return l >= threshold.load(std::memory_order_relaxed);
}
void set_level(level l) {
    threshold.store(l);
}

void set_sink(std::function<void(std::string_view)> s) {
    std::lock_guard lock(sink_mutex);
    sink = std::move(s);
}

void write(level l, std::string_view msg, boost::json::object fields) {
    if (!enabled(l)) return;
    boost::json::object line;
    line["ts"] = format_time(now_ms());
    line["level"] = names[static_cast<int>(l)];
    line["msg"] = msg;
    for (auto& kv : fields)
        line[kv.key()] = std::move(kv.value());
    std::string text = boost::json::serialize(line);
    text.push_back('\n');
    std::lock_guard lock(sink_mutex);
    if (sink)
        sink(text);
    else
        std::fwrite(text.data(), 1, text.size(), stderr);
}

void spawn_logger::operator()(std::exception_ptr e) const {
    if (!e) return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        error(what + " failed", {{"error", ex.what()}});
    } catch (...) {
        error(what + " failed", {{"error", "unknown exception"}});
    }
}

} // namespace baton::log
