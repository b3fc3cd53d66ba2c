// Server-Sent Events as a client sees them: the frames of a whole event-stream body, for tests
// that read a turn's events (docs/api.md "Turn events").
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace baton::test {

struct sse_frame {
    std::int64_t id = -1;
    std::string event;
    boost::json::value data;
};

// Frames of an event-stream body; comment lines are counted in `comments`.
inline std::vector<sse_frame> parse_sse(std::string_view body, int* comments = nullptr) {
    std::vector<sse_frame> out;
    sse_frame cur;
    bool any = false;
    while (!body.empty()) {
        auto nl = body.find('\n');
        std::string_view line = body.substr(0, nl);
        body.remove_prefix(nl == std::string_view::npos ? body.size() : nl + 1);
        if (line.empty()) {
            if (any) out.push_back(std::move(cur));
            cur = {};
            any = false;
        } else if (line.front() == ':') {
            if (comments) ++*comments;
        } else if (line.starts_with("id: ")) {
            cur.id = std::stoll(std::string(line.substr(4)));
            any = true;
        } else if (line.starts_with("event: ")) {
            cur.event = line.substr(7);
            any = true;
        } else if (line.starts_with("data: ")) {
            cur.data = boost::json::parse(line.substr(6));
            any = true;
        }
    }
    return out;
}

} // namespace baton::test
