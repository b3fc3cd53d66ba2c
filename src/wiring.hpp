// The parts `baton serve` and `baton chat` build the same way from a config: the config itself
// (a file or the embedded default), the store, and the framework's agents and tools.
#pragma once

#include <baton/config.hpp>
#include <baton/framework.hpp>
#include <baton/http_client.hpp>
#include <baton/store.hpp>
#include <baton/store_runner.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <memory>
#include <optional>
#include <string>

namespace baton {

// The config file, or the embedded default without one. Prints every error to stderr and returns
// nullopt when the file is invalid or unreadable (the caller exits 2).
std::optional<config> load_config_or_report(const std::optional<std::string>& file);

// What a runtime stands on, built from the config: the store (behind its runner), the framework
// with the config's agents (each with its model client) and HTTP tools, and their HTTP client.
// Members go in reverse order: the framework before the runner it uses. Call db->stop() after the
// io threads have been joined.
struct runtime_parts {
    std::unique_ptr<store_runner> db;
    std::unique_ptr<framework> fw;
    std::shared_ptr<http_client> http;
};

// Throws std::runtime_error for a store this build cannot open or an unknown model provider.
runtime_parts build_runtime_parts(const config& cfg, asio::any_io_executor ex);

} // namespace baton
