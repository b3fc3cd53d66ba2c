// `baton serve`: a thin main over baton::service (<baton/service.hpp>): the config, then start, wait for SIGTERM/SIGINT, stop.
#pragma once

#include <baton/config.hpp>

#include <optional>
#include <string>

namespace baton {

struct serve_options {
    std::optional<std::string> config_file;
    std::optional<std::string> listen;
    std::optional<std::string> data_dir;
    std::optional<int> threads;
    bool insecure_no_auth = false;
};

// Returns the process exit code.
int run_daemon(const serve_options& opts);

} // namespace baton
