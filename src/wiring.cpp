#include "src/wiring.hpp"

#include <baton/openai_client.hpp>
#include <baton/tools.hpp>

#include <iostream>
#include <stdexcept>

namespace baton {

namespace {
std::shared_ptr<model_client> make_model(asio::any_io_executor ex, const agent_config& a,
                                         const std::shared_ptr<http_client>& http) {
    if (a.model.provider == "echo") return make_echo_model();
    if (a.model.provider == "openai") return make_openai_model(ex, a.model, http);
    throw std::runtime_error("agents." + a.name + ".model.provider: unknown provider " +
                             a.model.provider);
}

std::shared_ptr<store> open_store(const config& cfg) {
    switch (cfg.storage.type) {
    case storage_config::kind::memory:
        return make_memory_store();
    case storage_config::kind::postgres:
        throw std::runtime_error("storage.postgres: PostgreSQL storage is not available in this build");
    case storage_config::kind::sqlite:
        break;
    }
    return make_sqlite_store({cfg.storage.sqlite_path, cfg.storage.sqlite_synchronous});
}
} // namespace

std::optional<config> load_config_or_report(const std::optional<std::string>& file) {
    try {
        if (!file) return default_config();
        auto loaded = load_config_file(*file);
        if (loaded.errors.empty()) return std::move(loaded.cfg);
        for (auto& e : loaded.errors)
            std::cerr << *file << ": " << e.to_string() << "\n";
    } catch (const std::exception& e) {
        std::cerr << "baton: " << e.what() << "\n";
    }
    return std::nullopt;
}

runtime_parts build_runtime_parts(const config& cfg, asio::any_io_executor ex) {
    runtime_parts p;
    p.db = std::make_unique<store_runner>(open_store(cfg));
    p.fw = std::make_unique<framework>(*p.db);
    p.http = std::make_shared<http_client>(ex);
    for (auto& [name, a] : cfg.agents)
        p.fw->add_agent(agent{a, make_model(ex, a, p.http)});
    for (auto& [name, t] : cfg.tools)
        p.fw->tools().add(make_http_tool(name, t, p.http));
    return p;
}

} // namespace baton
