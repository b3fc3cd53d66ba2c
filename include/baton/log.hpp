// A small levelled logger: JSON lines, one per event, serialised across threads, to a sink
// (stderr by default). Level from BATON_LOG (debug|info|warn|error; default info).
#pragma once

#include <boost/json/object.hpp>

#include <exception>
#include <functional>
#include <string>
#include <string_view>

namespace baton::log {

enum class level { debug, info, warn, error };

void write(level l, std::string_view msg, boost::json::object fields = {});
bool enabled(level l);
void set_level(level l);
// Replaces the sink (tests); an empty function restores stderr.
void set_sink(std::function<void(std::string_view line)> sink);

// A co_spawn completion handler that logs an escaped exception: one failure never ends the process.
struct spawn_logger {
    std::string what;
    void operator()(std::exception_ptr e) const;
};

inline void debug(std::string_view m, boost::json::object f = {}) {
    write(level::debug, m, std::move(f));
}
inline void info(std::string_view m, boost::json::object f = {}) {
    write(level::info, m, std::move(f));
}
inline void warn(std::string_view m, boost::json::object f = {}) {
    write(level::warn, m, std::move(f));
}
inline void error(std::string_view m, boost::json::object f = {}) {
    write(level::error, m, std::move(f));
}

} // namespace baton::log
