// baton's error codes: one enum (0 is success) with its own category, mapped to the HTTP status and
// the snake_case code of docs/api.md in one place.
#pragma once

#include <boost/assert/source_location.hpp>
#include <boost/system/error_code.hpp>

#include <cstdint>
#include <stdexcept>
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
    invalid_config, // a config the service cannot run (diagnostics say where)
    // Three answers that keep the API's code but have a status of their own (docs/api.md).
    headers_too_large,     // "invalid_request", 431
    upgrade_required,      // "invalid_request", 426 (a WebSocket upgrade, version 13)
    websocket_full,        // "overloaded", 503 (channels.ws.max_connections)
    forbidden,             // 403: a valid token without the scope (admin) the resource needs
    rate_limited,          // 429: the tenant's turns_per_minute
    quota_exceeded,        // 429: the tenant's tokens_per_day
    too_many_connections,  // "overloaded", 503: server.max_connections or the per-address cap
    store_unavailable,     // 503: the store's database is unreachable (Retry-After: 1)
};

const boost::system::error_category& baton_category() noexcept;
boost::system::error_code make_error_code(errc e) noexcept;

// The one mapping of errors to the API: the snake_case code of {"error": {"code"}} and the HTTP
// status. Every HTTP and WebSocket answer takes both from here.
std::string_view code_name(errc e); // "session_queue_full"
unsigned http_status(errc e);       // 429

// An API failure: what the HTTP and WebSocket channels render as {"error": {"code", "message"}}.
struct api_error {
    errc code = errc::internal_error;
    std::string message;
    std::int64_t retry_after_s = 0; // > 0: the Retry-After a 429 carries (seconds)
};
// When to try again, in seconds, as the HTTP `Retry-After` and the WebSocket error frame's
// `retry_after` say it: `retry_after_s` when set, else 1 for the refusals that pass (a full queue,
// an overloaded daemon, a rate, a quota, an unreachable database), else 0 (none).
std::int64_t retry_after(const api_error& e);
// What boost::system::result<T, api_error>::value() throws on an error: a system_error with the
// errc and the message.
[[noreturn]] void throw_exception_from_error(const api_error& e, const boost::source_location& loc);

// The sentence that explains an error_code, for the operations that take one (Boost.MySQL's
// pattern): filled when the operation fails, cleared when it succeeds.
class diagnostics {
public:
    const std::string& message() const { return message_; }
    void assign(std::string m) { message_ = std::move(m); }
    void clear() { message_.clear(); }

private:
    std::string message_;
};

// A turn's failure, raised by a stage or the model client: the code goes to the turn record's
// error and the tape ("model_error", "tool_error", "context_overflow", "invalid_request",
// "internal_error").
class turn_error : public std::runtime_error {
public:
    turn_error(std::string code, const std::string& message)
        : std::runtime_error(message), code_(std::move(code)) {}
    const std::string& code() const { return code_; }

private:
    std::string code_;
};

} // namespace baton

template <> struct boost::system::is_error_code_enum<baton::errc> : std::true_type {};
