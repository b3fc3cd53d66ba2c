// HTTP routing without I/O: method and target in, route (with its path parameters) or the
// 404/405 it deserves out. Unit-tested on its own.
#pragma once

#include <baton/errors.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace baton::http {

enum class route_id {
    none,
    post_message,
    get_turn,
    cancel_turn,
    get_session,
    get_tape,
    healthz,
    readyz,
    metrics,
    turn_events,
    websocket,
    list_outbox,
    usage,
    web_page
};

struct route_match {
    route_id id = route_id::none;
    std::string session_id; // decoded path parameter, not yet validated
    std::string turn_id;
    std::optional<errc> error; // not_found, method_not_allowed, invalid_request (bad target)
    std::string allow;         // the Allow header for 405
    std::string query;         // the raw query, without '?'
};

route_match match_route(std::string_view method, std::string_view target);

// Query parameters. Each reader gives nullopt when the parameter is absent and error text when
// the query is malformed, the value is, or the parameter is given more than once (docs/api.md).
//
// An unsigned integer.
struct query_int {
    std::optional<std::int64_t> value;
    std::string error;
};
query_int query_param_int(std::string_view query, std::string_view name);
// `?wait=S` (docs/api.md): seconds, a decimal number from 0 to 60 with at most 3 decimals.
struct query_wait {
    std::optional<std::chrono::milliseconds> value;
    std::string error;
};
query_wait query_param_wait(std::string_view query);
// Text: the decoded value.
struct query_text {
    std::optional<std::string> value;
    std::string error;
};
query_text query_param(std::string_view query, std::string_view name);

} // namespace baton::http
