// What `baton serve`, `baton chat` and `baton check-config` share: reading the config.
#pragma once

#include <baton/config.hpp>

#include <optional>
#include <string>

namespace baton {

// The config file, or the embedded default without one. Prints every error to stderr and returns
// nullopt when the file is invalid or unreadable (the caller exits 2).
std::optional<config> load_config_or_report(const std::optional<std::string>& file);

} // namespace baton
