// Routing and query parameters: any method and request target.
#include "channels/http/router.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    auto sp = in.find(' ');
    std::string_view method = sp == std::string_view::npos ? "GET" : in.substr(0, sp);
    std::string_view target = sp == std::string_view::npos ? in : in.substr(sp + 1);
    auto m = baton::http::match_route(method, target);
    if (m.error && m.id != baton::http::route_id::none && !m.allow.empty() &&
        m.session_id.size() > target.size())
        std::abort();
    for (auto name : {"after", "limit", "status"}) {
        auto q = baton::http::query_param_int(m.query, name);
        if (q.value && !q.error.empty()) std::abort();
        if (q.value && *q.value < 0) std::abort();
        auto t = baton::http::query_param(m.query, name);
        if (t.value && !t.error.empty()) std::abort();
    }
    return 0;
}
