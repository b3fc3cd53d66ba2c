// baton's error codes: one enum (0 is success) with its own category, mapped to the HTTP status and
// the snake_case code of docs/api.md in one place.
#pragma once

#include <boost/system/error_code.hpp>

#include <string>
#include <string_view>

namespace baton {

enum class errc {
    invalid_json = 1,
    invalid_request,
    unauthorized,
    not_found,
    method_not_allowed,
    idempotency_key_reused,
    turn_not_running,
    session_busy,
    payload_too_large,
    unsupported_media_type,
    session_queue_full,
    overloaded,
    draining,
    request_timeout,
    internal_error,
};

const boost::system::error_category& baton_category() noexcept;
boost::system::error_code make_error_code(errc e) noexcept;

std::string_view code_name(errc e); // "session_queue_full"
unsigned http_status(errc e);       // 429

// An API failure: what the HTTP and WebSocket channels render as {"error": {"code", "message"}}.
struct api_error {
    errc code = errc::internal_error;
    std::string message;
};

} // namespace baton

template <> struct boost::system::is_error_code_enum<baton::errc> : std::true_type {};
