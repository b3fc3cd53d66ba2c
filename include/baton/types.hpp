// Plain records shared by the runtime, the stores and the channels: turns, sessions, tape entries.
// No I/O here; JSON conversions live beside them so every surface renders a record the same way.
#pragma once

#include <boost/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

namespace json = boost::json;

// The tenant of a daemon without tokens, of an embedder that has no tenants, and of data stored
// before tenants existed.
inline constexpr std::string_view default_tenant = "default";

// A session's name: its tenant and its id. Sessions of two tenants are two sessions, even with one
// id. A bare id names a session of the default tenant.
struct session_ref {
    std::string tenant{default_tenant};
    std::string id;

    session_ref() = default;
    session_ref(std::string tenant_name, std::string session_id)
        : tenant(std::move(tenant_name)), id(std::move(session_id)) {}
    session_ref(std::string session_id) : id(std::move(session_id)) {} // NOLINT: implicit
    session_ref(const char* session_id) : id(session_id) {}            // NOLINT: implicit
    // One string per session, for maps: "<tenant>/<id>" ('/' is in neither).
    std::string key() const;
    friend bool operator==(const session_ref&, const session_ref&) = default;
};

// 1-64 characters of [A-Za-z0-9._-] (a tenant's name in the config and in every record).
bool valid_tenant_name(std::string_view name);

// Milliseconds since the Unix epoch; rendered as RFC 3339 UTC with milliseconds.
using time_ms = std::int64_t;
time_ms now_ms();
std::string format_time(time_ms t);

enum class turn_status { queued, running, completed, stopped, failed, timed_out, step_limit };
std::string_view to_string(turn_status s);
std::optional<turn_status> parse_turn_status(std::string_view s);
inline bool is_terminal(turn_status s) {
    return s != turn_status::queued && s != turn_status::running;
}

struct usage {
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
};

struct error_info {
    std::string code;
    std::string message;
};

// What a turn was asked to do: stored with the turn so that a restart can run it again.
struct turn_input {
    std::string channel = "http";
    std::string text;
    json::object metadata;
    json::value deliver; // null, or {"channel", "to"}
};

struct turn_record {
    std::string turn_id;
    std::string session_id;
    std::string agent = "default";
    std::string tenant{default_tenant};
    turn_status status = turn_status::queued;
    std::optional<std::string> reply;
    bool refusal = false; // the reply is the model's refusal: "refusal": true in the JSON
    std::int64_t steps = 0;
    baton::usage usage;
    std::optional<error_info> error;
    time_ms created_at = 0;
    std::optional<time_ms> started_at;
    std::optional<time_ms> finished_at;
    turn_input input;
    // How many times the turn has started: 1 on its first run, more when a crash ran it again.
    std::int64_t attempt = 0;
    bool side_effects = false; // it began a tool call (store::mark_side_effects)
};

// The public JSON of a turn record (docs/api.md "Turn record"), written as text: what a poll answers.
void append_turn_json(std::string& out, const turn_record& t);
std::string turn_json(const turn_record& t);
// The same, as a JSON object.
json::object to_json(const turn_record& t);
// The data of its turn.finished event: {status, reply, error (when set)}.
json::object finished_event_data(const turn_record& t);

enum class tape_kind { message, tool_call, tool_result, anchor, event, error };
std::string_view to_string(tape_kind k);
std::optional<tape_kind> parse_tape_kind(std::string_view s);

// The session a turn belongs to.
inline session_ref session_of(const turn_record& t) {
    return {t.tenant, t.session_id};
}

struct tape_entry {
    std::int64_t id = 0; // assigned by the store, increasing per session
    tape_kind kind = tape_kind::message;
    json::object payload;
    time_ms created_at = 0;
    std::string turn_id;
};
json::object to_json(const tape_entry& e);

tape_entry make_entry(tape_kind kind, json::object payload); // created now
tape_entry make_message(std::string_view role, std::string_view text);
tape_entry make_error_entry(std::string_view code, std::string_view message);
tape_entry make_event_entry(std::string_view name, json::value data);

struct session_record {
    std::string session_id;
    std::string agent = "default";
    std::string tenant{default_tenant};
    std::int64_t turns = 0;
    std::optional<std::string> last_turn_id;
    json::object state;
    time_ms created_at = 0;
};

// An outbound item (docs/api.md "Delivery"): stored before any byte is sent, under a key derived from
// (session, turn, channel, recipient, index), so the same reply is never enqueued twice.
enum class outbox_status { pending, sending, delivered, failed };
std::string_view to_string(outbox_status s);
std::optional<outbox_status> parse_outbox_status(std::string_view s);

struct outbox_item {
    std::string key;
    std::string turn_id;
    std::string tenant{default_tenant}; // its session's
    std::string session_id;
    std::string channel;
    std::string recipient;
    std::int64_t index = 0;
    std::string text;
    outbox_status status = outbox_status::pending;
    std::int64_t attempts = 0;
    bool uncertain = false;
    time_ms created_at = 0;
    time_ms updated_at = 0;
    time_ms next_attempt_at = 0; // a pending item waiting out its backoff is not sent before this
    std::string last_error;      // why the last attempt did not deliver (empty: none)
};
// The listing shape of GET /v1/outbox.
json::object to_json(const outbox_item& o);
// The derived key: "ob_" + 32 hex digits of SHA-256 over the five parts.
std::string outbox_key(std::string_view session_id, std::string_view turn_id, std::string_view channel,
                       std::string_view recipient, std::int64_t index);

// Lower-case hex SHA-256 (outbox keys, idempotency fingerprints).
std::string sha256_hex(std::string_view data);

// 1-128 characters of [A-Za-z0-9._:@-] (docs/api.md "Ids").
bool valid_session_id(std::string_view sid);
// A listen address as `server.listen` and `--listen` take it: IPv4:PORT, [IPv6]:PORT or
// localhost:PORT, port 0-65535 (an address, not a name: `serve` would refuse a name at start).
bool valid_listen_address(std::string_view listen);
// One of them on a loopback address: 127.0.0.0/8, [::1], localhost, or 127.x as [::ffff:127.x].
bool loopback_listen_address(std::string_view listen);

// Turn ids are made here: "t_" + 26 characters of a time-ordered, URL-safe alphabet.
std::string make_turn_id();
bool plausible_turn_id(std::string_view tid);

} // namespace baton
