// The parts `baton serve` and `baton chat` build the same way from a config: the config itself
// (a file or the embedded default), the store, and the framework's agents and tools.
#pragma once

#include <baton/config.hpp>
#include <baton/framework.hpp>
#include <baton/http_client.hpp>
#include <baton/store.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <memory>
#include <optional>
#include <string>

namespace baton {

// The config file, or the embedded default without one. Prints every error to stderr and returns
// nullopt when the file is invalid or unreadable (the caller exits 2).
std::optional<config> load_config_or_report(const std::optional<std::string>& file);

// The store the config names. Throws std::runtime_error for one this build cannot open.
std::shared_ptr<store> open_store(const config& cfg);

// Adds the config's agents (each with its model client) and HTTP tools to `fw`.
// Throws std::runtime_error for an unknown model provider.
void add_agents_and_tools(framework& fw, const config& cfg, asio::any_io_executor ex,
                          const std::shared_ptr<http_client>& http);

} // namespace baton
