// The daemon's configuration (docs/api.md "Config file"): plain structs with defaults, parsed strictly
// from JSON. Unknown keys and wrong types are errors carrying their JSON path.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

using std::chrono::milliseconds;

struct model_config {
    std::string provider = "echo"; // echo | openai
    std::string base_url = "https://api.openai.com/v1";
    std::string model = "echo";
    std::string api_key_env = "OPENAI_API_KEY";
    bool stream = true;
    milliseconds timeout{60000};
    std::int64_t max_output_tokens = 4096;
    std::int64_t context_window = 128000;
};

struct limits_config {
    std::int64_t max_steps = 12;
    milliseconds turn_timeout{300000};
    milliseconds tool_timeout{30000};
    std::int64_t max_reply_bytes = 65536;
    std::int64_t max_parallel_tools = 4;
};

struct context_config {
    std::int64_t reserve_output_tokens = 4096;
    std::vector<double> compaction_thresholds{0.6, 0.75, 0.9};
    milliseconds idle_compaction_after{600000};
};

enum class admission_mode { queue, collect, steer, interrupt, reject };
std::string_view to_string(admission_mode m);
std::optional<admission_mode> parse_admission_mode(std::string_view s);

struct admission_config {
    admission_mode mode = admission_mode::queue;
    std::int64_t max_queued = 32;
};

struct agent_config {
    std::string name = "default";
    model_config model;
    std::vector<std::string> instructions;
    std::vector<std::string> tools;
    limits_config limits;
    context_config context;
    admission_config admission;
    // A turn found mid-run at start (the daemon died under it): `fail` ends it failed with
    // error.code "abandoned"; `rerun` runs it again from its stored message.
    bool rerun_abandoned = false;
};

struct tool_config {
    std::string kind = "http";
    std::string url;
    milliseconds timeout{5000};
    std::string description;
    boost::json::object parameters{{"type", "object"}, {"properties", boost::json::object{}}};
};

// A bearer token (docs/api.md "Security"): only its SHA-256 is kept. A config may give the token
// itself (`token`, hashed when read); check-config warns about that.
struct token_config {
    std::string sha256; // lower-case hex of the bearer token
    std::string tenant;
    // "tenant": the tenant's own sessions, turns, events, tape, usage; "admin": the outbox
    // listing and /metrics. Absent in the config: {"tenant"}.
    std::vector<std::string> scopes{"tenant"};
};

struct tls_config {
    std::string cert_file; // PEM: the certificate, then any intermediates
    std::string key_file;  // PEM private key
};

struct server_config {
    std::string listen = "127.0.0.1:8080";
    std::int64_t threads = 0; // 0: hardware concurrency
    std::int64_t max_body_bytes = 1048576;
    std::vector<token_config> tokens;
    bool metrics_public = false; // GET /metrics without a token even when tokens are configured
    // TCP connections open at once (HTTP, SSE and WebSocket); one more is answered 503 and closed.
    std::int64_t max_connections = 20000;
    // Open at once from one client address before a request on them carried a valid token
    // (0: no cap). Absent: 1024 when tokens are configured or the address is not loopback, else
    // no cap (the trusted local daemon, load generators included).
    std::optional<std::int64_t> max_connections_per_ip;
    std::optional<tls_config> tls;
    std::int64_t max_header_bytes = 16384; // request line and headers; more: 431
    milliseconds header_timeout{10000};    // from a request's first byte to its last header; 408
    milliseconds body_timeout{30000};      // for the rest of the body; 408. Also each write
    milliseconds idle_timeout{60000};      // keep-alive wait for the next request
    milliseconds sse_heartbeat{15000};     // a comment line on an idle event stream
    std::int64_t events_per_turn = 1024;   // kept per turn for readers that resume (older: a gap)
};

struct storage_config {
    enum class kind { sqlite, postgres, memory } type = kind::sqlite;
    std::string sqlite_path = "var/baton.db";
    std::string sqlite_synchronous = "normal";
    std::string postgres_conninfo;
    std::string postgres_conninfo_env; // the environment variable holding the conninfo
    std::int64_t postgres_pool_size = 4;
    milliseconds postgres_connect_timeout{5000};
    milliseconds postgres_query_timeout{30000};
    bool postgres_cluster = false;      // several nodes on the database (docs/design.md)
    milliseconds postgres_lease{10000}; // a node is taken over once its lease ran out
    std::string postgres_node_id;       // empty: a random one at each start
};

struct webhook_target {
    std::string url;
    milliseconds timeout{10000};
    std::map<std::string, std::string> headers; // sent with every POST (e.g. Authorization)
};

// Per-tenant limits (docs/api.md "Quotas"); 0: no limit.
struct tenant_limits {
    std::int64_t max_running_turns = 0; // beyond it, the tenant's turns wait in their queues
    std::int64_t turns_per_minute = 0;  // GCRA; beyond it, 429 rate_limited
    std::int64_t tokens_per_day = 0;    // prompt + completion tokens (UTC day); 429 quota_exceeded
};

struct tenant_config {
    tenant_limits limits;
};

struct schedule_config {
    // Unique among the schedules; names its cursor and idempotency keys. When the config gives
    // none: "s<index>-<8 hex digits of a hash of the spec, session, agent and text>".
    std::string name;
    std::optional<std::int64_t> every_ms;
    std::string cron;
    std::string session;
    std::string agent = "default";
    std::string tenant = "default"; // whose session it writes to
    std::string text;
    // Where the reply goes, as a message's "deliver": null (the turn record only) or
    // {"channel", "to"} (e.g. a webhook target).
    boost::json::value deliver;
};

struct channels_config {
    bool ws_enabled = true;
    std::int64_t ws_max_connections = 10000;
    std::int64_t ws_max_frame_bytes = 1048576;
    std::int64_t ws_max_queued_frames = 4096;
    milliseconds ws_idle_timeout{60000};
    std::map<std::string, webhook_target> webhook_targets;
    std::int64_t webhook_max_concurrency = 8; // POSTs in flight at once, over all targets
    std::optional<std::string> telegram_token_env;
    std::string telegram_api_base = "https://api.telegram.org";
    std::vector<std::string> telegram_allow_chats;
    std::string telegram_agent = "default";    // the agent that answers Telegram chats
    std::string telegram_tenant = "default";   // whose sessions the chats are
    milliseconds telegram_debounce{0};         // 0: every message is a turn of its own
    milliseconds telegram_send_interval{1000}; // between two sends to one chat
    std::int64_t telegram_poll_timeout_s = 25; // getUpdates long-poll timeout (1-50 s)
    std::vector<schedule_config> schedules;
};

struct config {
    server_config server;
    storage_config storage;
    std::map<std::string, agent_config> agents; // never empty after parsing: "default" is made
    std::map<std::string, tool_config> tools;
    channels_config channels;
    std::map<std::string, tenant_config> tenants; // tenants without an entry have no limits
};

struct config_error {
    std::string path; // e.g. "agents.default.limits.max_steps"
    std::string message;
    std::string to_string() const { return path.empty() ? message : path + ": " + message; }
};

struct config_result {
    config cfg;
    std::vector<config_error> errors;   // empty when valid
    std::vector<config_error> warnings; // valid, but unwise (check-config prints them; serve logs them)
};

// Parses JSON text. Every problem found is reported, not just the first.
config_result parse_config(std::string_view json_text);
config_result load_config_file(const std::string& path);

// The embedded default (no file): agent "default" on the echo model unless BATON_MODEL says otherwise
// (`openai:<model>`, base URL from BATON_MODEL_BASE_URL).
config default_config();

} // namespace baton
