// Processes the benchmarks start themselves (the daemon, the mock model): a temp directory, a
// child started with posix_spawn whose first stdout line is its address, stopped by its pid.
#pragma once

#include "bench/net.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <sys/types.h>

#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace baton::bench {

// A temp directory removed with everything in it.
struct temp_dir {
    std::filesystem::path path;
    explicit temp_dir(const std::string& prefix = "baton-bench");
    ~temp_dir();
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
};

// A child this process started: stopped (SIGTERM, then SIGKILL after 15 s) on destruction.
struct child_process {
    pid_t pid = -1;
    int out = -1; // its stdout; kept open so that a later line never meets a closed pipe
    int status = 0;

    child_process() = default;
    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;
    ~child_process() { stop(); }

    // Starts `args` (args[0] the program), stderr to `log`, without the BATON_MODEL variable, and
    // returns its first stdout line (within 20 s).
    std::string start(const std::vector<std::string>& args, const std::filesystem::path& log);
    // SIGTERM and wait; returns the exit code (128 + signal; -1 when killed after the grace).
    int stop();
};

// `baton` next to this executable.
std::string default_baton_path();
// This executable (for `baton-bench mock-model`).
std::string self_path();

// The http://HOST:PORT of a `listening on http://HOST:PORT` line; throws otherwise.
http_url listening_url(const std::string& line);

// Runs one coroutine on `ctx` to completion.
template <class T> T run(asio::io_context& ctx, asio::awaitable<T> a) {
    std::optional<T> result;
    std::exception_ptr error;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
        error = e;
        if (!e) result = std::move(v);
    });
    ctx.run();
    ctx.restart();
    if (error) std::rethrow_exception(error);
    return std::move(*result);
}

// GET /healthz until 200 (10 s at most).
asio::awaitable<bool> wait_healthy(http_connection& c);

} // namespace baton::bench
