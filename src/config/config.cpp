#include <baton/auth.hpp>
#include <baton/config.hpp>

#include "src/config/config_walk.hpp"

#include "channels/schedule/cron.hpp"
#include <baton/types.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

namespace baton {

namespace json = boost::json;
using detail::config_errors;
using detail::object_reader;

namespace {

constexpr std::array<std::string_view, 5> admission_names{"queue", "collect", "steer", "interrupt",
                                                          "reject"};
constexpr std::string_view builtin_tools[] = {"clock"};
constexpr std::string_view http_url_message =
    "expected an http:// or https:// URL with a host (and a port of 1-65535 if any)";

bool is_builtin_tool(std::string_view name) {
    return std::find(std::begin(builtin_tools), std::end(builtin_tools), name) !=
           std::end(builtin_tools);
}

// OpenAI function names: 1-64 characters of [A-Za-z0-9_-] (exactly the keys child_path leaves bare).
bool is_tool_name(std::string_view name) {
    return !name.empty() && name.size() <= 64 && json_child_path("", name) == name;
}

bool is_hex64(std::string_view s) {
    if (s.size() != 64) return false;
    for (char c : s)
        if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    return true;
}

void read_url(const object_reader& o, std::string_view key, std::string& out) {
    if (o.read(key, out) && !detail::is_http_url(out)) o.fail(key, std::string(http_url_message));
}

void read_token(config_errors& e, config_errors& warnings, const json::value& v, std::string path,
                std::set<std::string>& seen, token_config& out) {
    object_reader o(e, v, std::move(path), {"sha256", "token", "tenant", "scopes"});
    if (!o) return;
    if (o.has("sha256") == o.has("token")) {
        o.fail("", "expected exactly one of sha256, token");
    } else if (o.has("token")) {
        std::string clear;
        // A token a client can send in `Authorization: Bearer …`, as the daemon reads that header
        // (RFC 6750's b64token; found by a new-user check: one with a space, a comma or a
        // non-ASCII letter was taken, and no request could ever present it).
        auto sendable = [](const std::string& t) { return parse_bearer("Bearer " + t) == t; };
        if (o.read_text("token", clear) && !sendable(clear)) {
            o.fail("token", "expected what a Bearer header can carry: letters, digits and - . _ ~ + "
                            "/, then = padding only");
        } else if (!clear.empty()) {
            // Never echoed: the warning names the place, not the token.
            out.sha256 = sha256_hex(clear);
            warnings.push_back({o.path("token"),
                                "a bearer token in clear text: anyone who reads this file can use it; "
                                "give its \"sha256\" instead (baton token hash)"});
        }
    } else if (o.read("sha256", out.sha256)) {
        for (char& c : out.sha256)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (!is_hex64(out.sha256)) {
            o.fail("sha256", "expected 64 hex characters");
            out.sha256.clear();
        }
    }
    if (!out.sha256.empty() && !seen.insert(out.sha256).second)
        o.fail(o.has("token") ? "token" : "sha256", "duplicate token");
    if (o.require("tenant") && o.read_text("tenant", out.tenant) && !valid_tenant_name(out.tenant))
        o.fail("tenant", "expected 1-64 characters of [A-Za-z0-9._-]");
    if (const json::array* scopes = o.array("scopes")) {
        out.scopes.clear();
        for (std::size_t i = 0; i < scopes->size(); ++i) {
            const auto& s = (*scopes)[i];
            if (!s.is_string() || (s.get_string() != "tenant" && s.get_string() != "admin")) {
                e.push_back({json_index_path(o.path("scopes"), i), "expected \"tenant\" or \"admin\""});
                continue;
            }
            std::string name(s.get_string());
            if (std::find(out.scopes.begin(), out.scopes.end(), name) == out.scopes.end())
                out.scopes.push_back(std::move(name));
        }
        if (scopes->empty()) o.fail("scopes", "expected at least one scope");
    }
}

void read_tls(config_errors& e, const json::value& v, std::string path, std::optional<tls_config>& out) {
    object_reader o(e, v, std::move(path), {"cert_file", "key_file"});
    if (!o) return;
    tls_config t;
    bool ok = o.require("cert_file") && o.read_text("cert_file", t.cert_file);
    ok = o.require("key_file") && o.read_text("key_file", t.key_file) && ok;
    if (ok) out = std::move(t);
}

void read_tenants(config_errors& e, const json::value& v, std::map<std::string, tenant_config>& out) {
    const json::object* all = detail::as_object(e, v, "tenants");
    if (all == nullptr) return;
    for (const auto& [key, value] : *all) {
        std::string name(key.data(), key.size());
        auto path = json_child_path("tenants", name);
        // A bad name is reported and its body still checked (every error at once), not kept.
        const bool named = valid_tenant_name(name);
        if (!named) e.push_back({path, "a tenant name is 1-64 characters of [A-Za-z0-9._-]"});
        object_reader t(e, value, path, {"limits"});
        tenant_config unnamed;
        auto& cfg = named ? out[name] : unnamed;
        if (const json::value* l = t.find("limits")) {
            object_reader lo(e, *l, t.path("limits"),
                             {"max_running_turns", "turns_per_minute", "tokens_per_day"});
            lo.read("max_running_turns", cfg.limits.max_running_turns, 0);
            lo.read("turns_per_minute", cfg.limits.turns_per_minute, 0, 1'000'000);
            lo.read("tokens_per_day", cfg.limits.tokens_per_day, 0);
        }
    }
}

void read_server(config_errors& e, config_errors& warnings, const json::value& v, server_config& out) {
    object_reader o(e, v, "server",
                    {"listen", "threads", "max_body_bytes", "tokens", "header_timeout_ms",
                     "idle_timeout_ms", "sse_heartbeat_ms", "events_per_turn", "metrics_public", "tls",
                     "max_connections", "max_connections_per_ip", "body_timeout_ms",
                     "max_header_bytes"});
    o.read("metrics_public", out.metrics_public);
    o.read("max_connections", out.max_connections, 1);
    if (std::int64_t per_ip = 0; o.read("max_connections_per_ip", per_ip, 0))
        out.max_connections_per_ip = per_ip;
    o.read("max_header_bytes", out.max_header_bytes, 1024, 1 << 20);
    o.read("body_timeout_ms", out.body_timeout);
    if (const json::value* t = o.find("tls")) read_tls(e, *t, o.path("tls"), out.tls);
    if (o.read("listen", out.listen) && !valid_listen_address(out.listen))
        o.fail("listen", "expected IP:PORT (an IPv4 address, [IPv6] or localhost; port 0..65535)");
    o.read("threads", out.threads, 0, 1024); // as --threads
    o.read("max_body_bytes", out.max_body_bytes, 1);
    o.read("header_timeout_ms", out.header_timeout);
    o.read("idle_timeout_ms", out.idle_timeout);
    o.read("sse_heartbeat_ms", out.sse_heartbeat);
    o.read("events_per_turn", out.events_per_turn, 2);
    if (const json::array* tokens = o.array("tokens")) {
        std::set<std::string> seen;
        out.tokens.assign(tokens->size(), token_config{});
        for (std::size_t i = 0; i < tokens->size(); ++i)
            read_token(e, warnings, (*tokens)[i], json_index_path(o.path("tokens"), i), seen,
                       out.tokens[i]);
    }
}

void read_storage(config_errors& e, const json::value& v, storage_config& out) {
    object_reader o(e, v, "storage", {"sqlite", "postgres", "memory"});
    if (!o) return;
    if (o.has("sqlite") + o.has("postgres") + o.has("memory") != 1)
        o.fail("", "expected exactly one of sqlite, postgres, memory");
    if (const json::value* s = o.find("sqlite")) {
        out.type = storage_config::kind::sqlite;
        object_reader so(e, *s, o.path("sqlite"), {"path", "synchronous"});
        so.read_text("path", out.sqlite_path);
        if (so.read("synchronous", out.sqlite_synchronous) && out.sqlite_synchronous != "off" &&
            out.sqlite_synchronous != "normal" && out.sqlite_synchronous != "full")
            so.fail("synchronous", "expected one of: off, normal, full");
    }
    if (const json::value* p = o.find("postgres")) {
        out.type = storage_config::kind::postgres;
        object_reader po(e, *p, o.path("postgres"),
                         {"conninfo", "conninfo_env", "pool_size", "connect_timeout_ms",
                          "query_timeout_ms", "cluster", "lease_ms", "node_id"});
        if (po.has("conninfo") == po.has("conninfo_env"))
            po.fail("", "expected exactly one of conninfo, conninfo_env");
        if (po.read_text("conninfo", out.postgres_conninfo) &&
            detail::conninfo_names_password(out.postgres_conninfo))
            po.fail("conninfo", "names a password; give it in PGPASSWORD or ~/.pgpass (or the whole "
                                "conninfo through conninfo_env)");
        po.read_text("conninfo_env", out.postgres_conninfo_env);
        po.read("pool_size", out.postgres_pool_size, 1, 1000);
        po.read("connect_timeout_ms", out.postgres_connect_timeout);
        po.read("query_timeout_ms", out.postgres_query_timeout);
        po.read("cluster", out.postgres_cluster);
        // At least two renewals (one a second) fit in a lease.
        po.read("lease_ms", out.postgres_lease, 2000);
        if (po.read_text("node_id", out.postgres_node_id) &&
            (out.postgres_node_id.size() > 64 ||
             out.postgres_node_id.find_first_not_of(
                 "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 "0123456789-_.") != std::string::npos))
            po.fail("node_id", "expected 1 to 64 letters, digits, '-', '_' or '.'");
        if ((po.has("lease_ms") || po.has("node_id")) && !out.postgres_cluster)
            po.fail(po.has("lease_ms") ? "lease_ms" : "node_id", "applies only with \"cluster\": true");
    }
    if (const json::value* m = o.find("memory")) {
        out.type = storage_config::kind::memory;
        [[maybe_unused]] object_reader mo(e, *m, o.path("memory"), {}); // reports any key
    }
}

void read_model(config_errors& e, const json::value& v, std::string path, model_config& out) {
    object_reader o(e, v, std::move(path),
                    {"provider", "base_url", "model", "api_key_env", "stream", "timeout_ms",
                     "max_output_tokens", "context_window"});
    if (!o) return;
    // Required so that a forgotten provider does not silently run the echo model.
    if (o.require("provider") && o.read("provider", out.provider) && out.provider != "openai" &&
        out.provider != "echo")
        o.fail("provider", "expected one of: openai, echo");
    if (out.provider == "openai") o.require("model");
    o.read_text("model", out.model);
    read_url(o, "base_url", out.base_url);
    o.read("api_key_env", out.api_key_env);
    o.read("stream", out.stream);
    o.read("timeout_ms", out.timeout);
    o.read("max_output_tokens", out.max_output_tokens, 1);
    o.read("context_window", out.context_window, 1);
}

void read_limits(config_errors& e, const json::value& v, std::string path, limits_config& out) {
    object_reader o(
        e, v, std::move(path),
        {"max_steps", "turn_timeout_ms", "tool_timeout_ms", "max_reply_bytes", "max_parallel_tools"});
    o.read("max_steps", out.max_steps, 1);
    o.read("turn_timeout_ms", out.turn_timeout);
    o.read("tool_timeout_ms", out.tool_timeout);
    o.read("max_reply_bytes", out.max_reply_bytes, 1);
    o.read("max_parallel_tools", out.max_parallel_tools, 1);
}

void read_thresholds(const object_reader& o, std::vector<double>& out) {
    const json::array* a = o.array("compaction_thresholds");
    if (a == nullptr) return;
    const std::string path = o.path("compaction_thresholds");
    if (a->empty()) return o.fail("compaction_thresholds", "must not be empty");
    std::vector<double> values(a->size());
    bool ok = true;
    for (std::size_t i = 0; i < a->size(); ++i) {
        if (!detail::read_number(o.errors(), (*a)[i], json_index_path(path, i), values[i])) {
            ok = false;
        } else if (!(values[i] > 0.0 && values[i] <= 1.0)) {
            o.errors().push_back({json_index_path(path, i), "must be in (0, 1]"});
            ok = false;
        } else if (i > 0 && ok && values[i] <= values[i - 1]) {
            o.errors().push_back(
                {json_index_path(path, i), "must be greater than the previous threshold"});
            ok = false;
        }
    }
    if (ok) out = std::move(values);
}

void read_context(config_errors& e, const json::value& v, std::string path, context_config& out) {
    object_reader o(e, v, std::move(path),
                    {"reserve_output_tokens", "compaction_thresholds", "idle_compaction_after_ms"});
    o.read("reserve_output_tokens", out.reserve_output_tokens, 0);
    read_thresholds(o, out.compaction_thresholds);
    o.read("idle_compaction_after_ms", out.idle_compaction_after, 0); // 0: no idle compaction
}

void read_admission(config_errors& e, const json::value& v, std::string path, admission_config& out) {
    object_reader o(e, v, std::move(path), {"mode", "max_queued"});
    std::string mode;
    if (o.read("mode", mode)) {
        if (auto m = parse_admission_mode(mode))
            out.mode = *m;
        else
            o.fail("mode", "expected one of: queue, collect, steer, interrupt, reject");
    }
    o.read("max_queued", out.max_queued, 0);
}

void check_agent_tools(const object_reader& o, const agent_config& a, const config& cfg) {
    std::set<std::string_view> seen;
    for (std::size_t i = 0; i < a.tools.size(); ++i) {
        const std::string& t = a.tools[i];
        std::string path = json_index_path(o.path("tools"), i);
        if (!is_builtin_tool(t) && cfg.tools.count(t) == 0)
            o.errors().push_back({path, "unknown tool \"" + t + "\""});
        else if (!seen.insert(t).second)
            o.errors().push_back({path, "duplicate tool \"" + t + "\""});
    }
}

void read_agent(config_errors& e, const json::value& v, std::string path, const config& cfg,
                agent_config& out) {
    object_reader o(
        e, v, std::move(path),
        {"model", "instructions", "tools", "limits", "context", "admission", "on_abandoned"});
    if (!o) return;
    std::string abandoned;
    if (o.read("on_abandoned", abandoned)) {
        if (abandoned == "rerun" || abandoned == "fail")
            out.rerun_abandoned = abandoned == "rerun";
        else
            o.fail("on_abandoned", "expected one of: fail, rerun");
    }
    if (const json::value* m = o.find("model")) read_model(e, *m, o.path("model"), out.model);
    o.read("instructions", out.instructions);
    if (o.read("tools", out.tools)) check_agent_tools(o, out, cfg);
    if (const json::value* l = o.find("limits")) read_limits(e, *l, o.path("limits"), out.limits);
    if (const json::value* c = o.find("context")) read_context(e, *c, o.path("context"), out.context);
    if (const json::value* a = o.find("admission"))
        read_admission(e, *a, o.path("admission"), out.admission);
    if (out.context.reserve_output_tokens >= out.model.context_window)
        e.push_back({o.path("context") + ".reserve_output_tokens",
                     "must be less than model.context_window (" +
                         std::to_string(out.model.context_window) + ")"});
}

void read_tool(config_errors& e, const json::value& v, std::string path, tool_config& out) {
    object_reader o(e, v, std::move(path), {"kind", "url", "timeout_ms", "description", "parameters"});
    if (!o) return;
    if (o.read("kind", out.kind) && out.kind != "http") o.fail("kind", "expected one of: http");
    if (out.kind == "http" && o.require("url")) read_url(o, "url", out.url);
    o.read("timeout_ms", out.timeout);
    o.read("description", out.description);
    if (const json::object* p = o.object("parameters")) out.parameters = *p;
}

void read_tools(config_errors& e, const json::value& v, std::map<std::string, tool_config>& out) {
    const json::object* tools = detail::as_object(e, v, "tools");
    if (tools == nullptr) return;
    for (const auto& [key, value] : *tools) {
        std::string name(key.data(), key.size());
        std::string path = json_child_path("tools", name);
        if (!is_tool_name(name))
            e.push_back({path, "tool name must be 1-64 characters of [A-Za-z0-9_-]"});
        else if (is_builtin_tool(name))
            e.push_back({path, "name is taken by a builtin tool"});
        read_tool(e, value, path, out[name]);
    }
}

void read_agents(config_errors& e, const json::value& v, config& cfg) {
    const json::object* agents = detail::as_object(e, v, "agents");
    if (agents == nullptr) return;
    for (const auto& [key, value] : *agents) {
        std::string name(key.data(), key.size());
        std::string path = json_child_path("agents", name);
        if (name.empty()) e.push_back({path, "agent name must not be empty"});
        agent_config& a = cfg.agents[name];
        a.name = name;
        read_agent(e, value, path, cfg, a);
    }
}

void read_webhook(config_errors& e, const json::value& v, std::string path, channels_config& out) {
    object_reader o(e, v, std::move(path), {"targets", "max_concurrency"});
    o.read("max_concurrency", out.webhook_max_concurrency, 1, 1024);
    const json::object* targets = o.object("targets");
    if (targets == nullptr) return;
    for (const auto& [key, value] : *targets) {
        std::string name(key.data(), key.size());
        object_reader t(e, value, json_child_path(o.path("targets"), name),
                        {"url", "timeout_ms", "headers"});
        webhook_target& target = out.webhook_targets[name];
        if (name.empty()) t.fail("", "target name must not be empty");
        if (t.require("url")) read_url(t, "url", target.url);
        t.read("timeout_ms", target.timeout);
        const json::object* headers = t.object("headers");
        if (headers == nullptr) continue;
        std::set<std::string> seen_names; // lower case: HTTP names are case-insensitive
        for (const auto& [hk, hv] : *headers) {
            std::string hname(hk.data(), hk.size());
            std::string hpath = json_child_path(t.path("headers"), hname);
            bool token = !hname.empty() && std::all_of(hname.begin(), hname.end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
            });
            std::string lower = hname;
            for (char& c : lower)
                c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            // The request's own headers: sent twice they would contradict each other (found by a
            // new-user check).
            static const std::set<std::string> own = {
                "content-type",    "content-length",    "host",
                "idempotency-key", "transfer-encoding", "connection"};
            if (!token)
                e.push_back({hpath, "header name must be letters, digits, '-' or '_'"});
            else if (own.count(lower))
                e.push_back({hpath, "set by baton for every delivery; not a target header"});
            else if (!seen_names.insert(lower).second)
                e.push_back({hpath, "given twice (header names are case-insensitive)"});
            else if (!hv.is_string())
                e.push_back({hpath, "expected string"});
            else if (hv.get_string().find_first_of("\r\n") != json::string::npos)
                e.push_back({hpath, "header value must not contain a line break"});
            else
                target.headers[hname] = std::string(hv.get_string());
        }
    }
}

// A channel's "agent", given or the default: it must be configured, or every message or fire of
// the channel would be dropped at run time (found by a new-user check: a config whose agents do
// not include "default" passed with a Telegram channel or schedule that named none).
void check_channel_agent(object_reader& o, const config& cfg, std::string& agent) {
    if (o.find("agent")) {
        if (o.read("agent", agent) && cfg.agents.count(agent) == 0)
            o.fail("agent", "unknown agent \"" + agent + "\"");
    } else if (cfg.agents.count(agent) == 0) {
        o.fail("agent", "required: the agents do not include \"" + agent +
                            "\", which a channel that names none uses");
    }
}

void read_telegram(config_errors& e, const json::value& v, std::string path, const config& cfg,
                   channels_config& out) {
    object_reader o(e, v, std::move(path),
                    {"token_env", "api_base", "allow_chats", "agent", "debounce_ms", "send_interval_ms",
                     "poll_timeout_s", "tenant"});
    if (!o) return;
    if (o.read_text("tenant", out.telegram_tenant) && !valid_tenant_name(out.telegram_tenant))
        o.fail("tenant", "expected 1-64 characters of [A-Za-z0-9._-]");
    std::string token_env;
    if (o.require("token_env") && o.read_text("token_env", token_env))
        out.telegram_token_env = token_env;
    read_url(o, "api_base", out.telegram_api_base);
    check_channel_agent(o, cfg, out.telegram_agent);
    // Zero is meaningful for these two (no debounce, no pacing), so not the `*_ms` reader.
    std::int64_t ms = 0;
    if (o.read("debounce_ms", ms, 0, detail::max_duration_ms)) out.telegram_debounce = milliseconds(ms);
    if (o.read("send_interval_ms", ms, 0, detail::max_duration_ms))
        out.telegram_send_interval = milliseconds(ms);
    // The Bot API allows 0 to 50 s; 0 (short polling) would call it without a pause.
    o.read("poll_timeout_s", out.telegram_poll_timeout_s, 1, 50);
    const json::array* chats = o.array("allow_chats");
    if (chats == nullptr) return;
    // Chat ids are integers in the Bot API; strings are accepted too.
    for (std::size_t i = 0; i < chats->size(); ++i) {
        const json::value& c = (*chats)[i];
        if (c.is_string())
            out.telegram_allow_chats.emplace_back(c.get_string().data(), c.get_string().size());
        else if (c.is_int64() || c.is_uint64())
            out.telegram_allow_chats.push_back(json::serialize(c));
        else
            e.push_back({json_index_path(o.path("allow_chats"), i), "expected string or integer"});
    }
}

// Schedule names go into idempotency keys ("schedule <name> <ms>") and cursor names.
bool is_schedule_name(std::string_view s) {
    return !s.empty() && s.size() <= 64 && valid_session_id(s);
}

// A schedule's "deliver": {"channel", "to"}, checked against the channels this config can reach.
void read_schedule_deliver(config_errors& e, const json::value& v, std::string path, const config& cfg,
                           schedule_config& out) {
    object_reader o(e, v, std::move(path), {"channel", "to"});
    if (!o) return;
    std::string channel, to;
    if (!o.require("channel") || !o.read_text("channel", channel)) return;
    bool has_to = o.has("to") && o.read_text("to", to);
    if ((channel == "webhook" || channel == "telegram") && !o.require("to")) return;
    if (channel == "webhook") {
        if (has_to && cfg.channels.webhook_targets.count(to) == 0)
            o.fail("to", "unknown webhook target \"" + to + "\"");
    } else if (channel == "telegram") {
        const auto& allowed = cfg.channels.telegram_allow_chats;
        if (!cfg.channels.telegram_token_env)
            o.fail("channel", "channels.telegram is not configured");
        else if (has_to && !allowed.empty() &&
                 std::find(allowed.begin(), allowed.end(), to) == allowed.end())
            // As the channel refuses it at run time: every fire would be refused.
            o.fail("to", "chat " + to + " is not in channels.telegram.allow_chats");
    } else if (channel == "ws") {
        if (!cfg.channels.ws_enabled) o.fail("channel", "channels.ws is disabled");
    } else if (channel != "http") {
        o.fail("channel", "expected http, ws, webhook or telegram");
        return;
    }
    // As the HTTP API refuses it: these reply to the session, to nobody named.
    if (has_to && channel == "http")
        o.fail("to", "the http channel's reply is the turn record: give no to");
    if (has_to && channel == "ws")
        o.fail("to", "the ws channel delivers to the session's own followers: give no to");
    json::object d{{"channel", channel}};
    if (has_to) d["to"] = to;
    out.deliver = std::move(d);
}

void read_schedule(config_errors& e, const json::value& v, std::string path, const config& cfg,
                   schedule_config& out) {
    object_reader o(e, v, std::move(path),
                    {"name", "every_ms", "cron", "session", "agent", "text", "deliver", "tenant"});
    if (!o) return;
    if (o.read_text("tenant", out.tenant) && !valid_tenant_name(out.tenant))
        o.fail("tenant", "expected 1-64 characters of [A-Za-z0-9._-]");
    if (o.read("name", out.name) && !is_schedule_name(out.name))
        o.fail("name", "expected 1-64 characters of [A-Za-z0-9._:@-]");
    if (o.has("every_ms") == o.has("cron")) o.fail("", "expected exactly one of every_ms, cron");
    std::int64_t every = 0;
    // Ten years at most: slot arithmetic stays far from overflow.
    if (o.read("every_ms", every, 1, detail::max_duration_ms)) out.every_ms = every;
    if (o.read_text("cron", out.cron)) {
        if (auto parsed = parse_cron(out.cron); !parsed)
            o.fail("cron", parsed.error());
        else if (!can_ever_fire(*parsed))
            o.fail("cron", "never fires (no selected month has the selected day of month)");
    }
    if (o.require("session") && o.read("session", out.session) && !valid_session_id(out.session))
        o.fail("session", "expected 1-128 characters of [A-Za-z0-9._:@-]");
    check_channel_agent(o, cfg, out.agent);
    if (o.require("text")) o.read_text("text", out.text);
    if (const json::value* d = o.find("deliver"))
        read_schedule_deliver(e, *d, o.path("deliver"), cfg, out);
}

// Gives unnamed schedules their derived name, then checks that every name is unique.
void name_schedules(config_errors& e, const std::string& path, std::vector<schedule_config>& all) {
    for (std::size_t i = 0; i < all.size(); ++i) {
        auto& s = all[i];
        if (!s.name.empty()) continue;
        std::string spec = s.every_ms ? "every_ms " + std::to_string(*s.every_ms) : "cron " + s.cron;
        auto hash = sha256_hex(spec + "\n" + s.session + "\n" + s.agent + "\n" + s.text);
        s.name = "s" + std::to_string(i) + "-" + hash.substr(0, 8);
    }
    std::set<std::string> seen;
    for (std::size_t i = 0; i < all.size(); ++i)
        if (!seen.insert(all[i].name).second)
            e.push_back({json_child_path(json_index_path(path, i), "name"),
                         "duplicate schedule name \"" + all[i].name + "\""});
}

void read_channels(config_errors& e, const json::value& v, const config& cfg, channels_config& out) {
    object_reader o(e, v, "channels", {"ws", "webhook", "telegram", "schedules"});
    if (const json::value* ws = o.find("ws")) {
        object_reader w(
            e, *ws, o.path("ws"),
            {"enabled", "max_connections", "max_frame_bytes", "max_queued_frames", "idle_timeout_ms"});
        w.read("enabled", out.ws_enabled);
        w.read("max_connections", out.ws_max_connections, 1);
        w.read("max_frame_bytes", out.ws_max_frame_bytes, 16);
        w.read("max_queued_frames", out.ws_max_queued_frames, 1);
        w.read("idle_timeout_ms", out.ws_idle_timeout);
    }
    if (const json::value* w = o.find("webhook")) read_webhook(e, *w, o.path("webhook"), out);
    if (const json::value* t = o.find("telegram")) read_telegram(e, *t, o.path("telegram"), cfg, out);
    if (const json::array* s = o.array("schedules")) {
        out.schedules.assign(s->size(), schedule_config{});
        for (std::size_t i = 0; i < s->size(); ++i)
            read_schedule(e, (*s)[i], json_index_path(o.path("schedules"), i), cfg, out.schedules[i]);
        name_schedules(e, o.path("schedules"), out.schedules);
    }
}

} // namespace

std::string_view to_string(admission_mode m) {
    return admission_names.at(static_cast<std::size_t>(m));
}

std::optional<admission_mode> parse_admission_mode(std::string_view s) {
    for (std::size_t i = 0; i < admission_names.size(); ++i)
        if (admission_names[i] == s) return static_cast<admission_mode>(i);
    return std::nullopt;
}

config_result parse_config(std::string_view json_text) {
    config_result r;
    json::value root = detail::parse_json_strict(json_text, r.errors);
    if (root.is_null() && !r.errors.empty()) return r;
    if (!root.is_object()) {
        r.errors.push_back({"", "the config must be a JSON object"});
        return r;
    }
    object_reader o(r.errors, root, "", {"server", "storage", "agents", "tools", "channels", "tenants"});
    if (const json::value* v = o.find("server")) read_server(r.errors, r.warnings, *v, r.cfg.server);
    if (const json::value* v = o.find("tenants")) read_tenants(r.errors, *v, r.cfg.tenants);
    if (const json::value* v = o.find("storage")) read_storage(r.errors, *v, r.cfg.storage);
    // Tools before agents (agents name tools), agents before channels (schedules name agents).
    if (const json::value* v = o.find("tools")) read_tools(r.errors, *v, r.cfg.tools);
    if (const json::value* v = o.find("agents")) read_agents(r.errors, *v, r.cfg);
    if (r.cfg.agents.empty()) {
        try {
            r.cfg.agents = default_config().agents;
        } catch (const std::invalid_argument& e) {
            r.errors.push_back({"", e.what()});
            r.cfg.agents.emplace("default", agent_config{});
        }
    }
    if (const json::value* v = o.find("channels")) read_channels(r.errors, *v, r.cfg, r.cfg.channels);
    if (r.cfg.server.tokens.empty() && !loopback_listen_address(r.cfg.server.listen))
        r.warnings.push_back({"server.listen",
                              "a non-loopback address without server.tokens: refused at start "
                              "unless --insecure-no-auth (baton serve) or "
                              "allow_unauthenticated_remote (service_options)"});
    if (!r.cfg.server.tokens.empty() && !r.cfg.server.tls &&
        !loopback_listen_address(r.cfg.server.listen))
        r.warnings.push_back({"server.listen",
                              "a non-loopback address with bearer tokens but no server.tls: tokens "
                              "and replies cross the network in clear text"});
    return r;
}

config_result load_config_file(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    std::string text;
    int err = f == nullptr ? errno : 0;
    if (f != nullptr) {
        char buf[65536];
        std::size_t n = 0;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
            text.append(buf, n);
        if (std::ferror(f)) err = errno != 0 ? errno : EIO;
        std::fclose(f);
    }
    if (err != 0) {
        config_result r;
        r.errors.push_back({"", "cannot read " + path + ": " + std::strerror(err)});
        return r;
    }
    return parse_config(text);
}

config default_config() {
    config cfg;
    agent_config agent;
    agent.name = "default";
    agent.tools = {"clock"};
    const char* model = std::getenv("BATON_MODEL");
    std::string_view spec = model == nullptr ? "" : model;
    constexpr std::string_view openai_prefix = "openai:";
    if (spec.empty() || spec == "echo") {
        agent.model.provider = "echo";
        agent.model.model = "echo";
    } else if (spec.size() > openai_prefix.size() &&
               spec.substr(0, openai_prefix.size()) == openai_prefix) {
        agent.model.provider = "openai";
        agent.model.model = std::string(spec.substr(openai_prefix.size()));
        const char* base = std::getenv("BATON_MODEL_BASE_URL");
        if (base != nullptr && *base != '\0') {
            if (!detail::is_http_url(base))
                throw std::invalid_argument("BATON_MODEL_BASE_URL: " + std::string(http_url_message));
            agent.model.base_url = base;
        }
    } else {
        throw std::invalid_argument("BATON_MODEL: expected `echo` or `openai:<model>`");
    }
    cfg.agents.emplace("default", std::move(agent));
    return cfg;
}

} // namespace baton
