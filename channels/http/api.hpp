// The REST surface of docs/api.md, without sockets: a request view in, a reply out. The Beast server
// (server.cpp) does the I/O; this file does validation, routing and rendering.
#pragma once

#include <baton/auth.hpp>
#include <baton/config.hpp>
#include <baton/errors.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace baton::http {

struct request_view {
    std::string_view method;
    std::string_view target;
    std::string_view content_type; // empty when absent or empty
    bool has_content_type = false; // the header is there (perhaps empty)
    std::string_view idempotency_key;
    bool has_idempotency_key = false;
    std::string_view body;
    std::string_view last_event_id; // SSE resume header; empty when absent
    std::string_view authorization; // the Authorization header; empty when absent
    bool has_authorization = false;
    std::string_view ws_protocols; // Sec-WebSocket-Protocol (an upgrade); empty when absent
    std::string_view host;         // the Host header; empty when absent
    std::string_view origin;       // the Origin header (a browser's); empty when absent
    bool has_origin = false;
};

// Who may call what (docs/api.md "Security").
struct access_options {
    authenticator tokens;        // none configured: every caller is the default tenant, admin too
    bool metrics_public = false; // GET /metrics without a token
    // Listening on loopback: without tokens, only requests addressed to a loopback name (Host)
    // are answered, against DNS rebinding.
    bool loopback = false;
};

// Where GET /v1/turns/{tid}/events streams from: the turn's live log, resumed after `after`; or,
// for a finished turn whose events are no longer kept, its turn.finished alone.
struct event_stream {
    std::shared_ptr<turn_log> log;
    std::int64_t after = 0;
    std::shared_ptr<const turn_event> final_only;
};

struct reply {
    unsigned status = 200;
    std::string body;
    std::string content_type = "application/json";
    std::vector<std::pair<std::string, std::string>> headers;
    bool head = false; // an answer to HEAD: the body's Content-Length, not the body
};

reply error_reply(errc code, std::string_view message);
// The same for a refusal of the runtime's (a 429 with its Retry-After).
reply error_reply(const api_error& e);

class api {
public:
    // `ready` tells /readyz whether the daemon takes traffic (false while starting or draining).
    api(runtime& rt, std::function<bool()> ready, access_options access = {})
        : rt_(rt), ready_(std::move(ready)), access_(std::move(access)) {}

    // Cancellation: none; a request runs to its answer.
    asio::awaitable<reply> handle(const request_view& req);
    // GET /v1/turns/{tid}/events (the server streams it): the stream, or the error to send.
    asio::awaitable<std::variant<reply, event_stream>>
    open_events(const request_view& req, const std::string& tid, std::string_view query);
    // The caller of a request to a resource that needs `need`, or the 401/403 to answer. A
    // WebSocket upgrade may carry its token in a "bearer.<token>" subprotocol instead.
    enum class scope { open, any, tenant, admin, metrics };
    std::variant<caller, reply> authorize(const request_view& req, scope need) const;
    // True when tokens are configured and the request carries a valid one (Authorization, or a
    // WebSocket upgrade's bearer.<token> subprotocol), whatever its scopes.
    bool token_valid(const request_view& req) const;
    bool auth_enabled() const { return access_.tokens.enabled(); }

private:
    asio::awaitable<reply> post_message(const request_view& req, const std::string& sid,
                                        std::string_view query, const caller& who);
    asio::awaitable<reply> get_turn(const std::string& tid, std::string_view query, const caller& who);
    asio::awaitable<reply> cancel_turn(const std::string& tid, const caller& who);
    asio::awaitable<reply> get_session(const std::string& sid, const caller& who);
    asio::awaitable<reply> get_tape(const std::string& sid, std::string_view query, const caller& who);
    asio::awaitable<reply> list_outbox(std::string_view query);
    asio::awaitable<reply> usage(const caller& who);
    asio::awaitable<reply> metrics_page();

    runtime& rt_;
    std::function<bool()> ready_;
    std::optional<caller> identify(const request_view& req, bool& presented) const;

    access_options access_;
    // The outbox counts of the last scrape: GET /metrics needs no token, so scrapes in quick
    // succession reuse them instead of each queueing a count on the store's thread.
    struct outbox_sample {
        std::mutex mutex;
        std::optional<store::outbox_counts> counts;
        std::chrono::steady_clock::time_point taken;
        bool counting = false;
    };
    std::shared_ptr<outbox_sample> outbox_sample_ = std::make_shared<outbox_sample>();
};

// Checks a POST body against docs/api.md; fills `out` or returns the error to send.
std::optional<api_error> parse_message_body(std::string_view body, accept_request& out);
bool valid_utf8(std::string_view s);

} // namespace baton::http
