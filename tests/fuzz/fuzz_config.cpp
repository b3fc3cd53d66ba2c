// The config parser: any text gives a config or errors with their JSON paths, never a crash.
#include <baton/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    auto r = baton::parse_config(in);
    for (auto& e : r.errors)
        if (e.message.empty()) std::abort();
    return 0;
}
