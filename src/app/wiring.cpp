#include "src/app/wiring.hpp"

#include <iostream>

namespace baton {

std::optional<config> load_config_or_report(const std::optional<std::string>& file) {
    try {
        if (!file) return default_config();
        auto loaded = load_config_file(*file);
        for (auto& w : loaded.warnings)
            std::cerr << *file << ": warning: " << w.to_string() << "\n";
        if (loaded.errors.empty()) return std::move(loaded.cfg);
        for (auto& e : loaded.errors)
            std::cerr << *file << ": " << e.to_string() << "\n";
    } catch (const std::exception& e) {
        std::cerr << "baton: " << e.what() << "\n";
    }
    return std::nullopt;
}

} // namespace baton
