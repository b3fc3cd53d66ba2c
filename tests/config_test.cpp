#include <baton/config.hpp>
#include <baton/types.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>

#include <unistd.h>

using namespace std::chrono_literals;

namespace {

// The example of docs/api.md "Config file", with a real token hash.
constexpr const char* api_example = R"({
  "server":   {"listen": "127.0.0.1:8080", "threads": 0, "max_body_bytes": 1048576,
               "tokens": [{"sha256": "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08", "tenant": "acme"}]},
  "storage":  {"sqlite": {"path": "var/baton.db", "synchronous": "normal"}},
  "agents": {
    "default": {
      "model": {"provider": "openai", "base_url": "http://127.0.0.1:9000/v1", "model": "gpt-4o-mini",
                "api_key_env": "OPENAI_API_KEY", "stream": true, "timeout_ms": 60000,
                "max_output_tokens": 4096, "context_window": 128000},
      "instructions": ["pinned block, survives every compaction", "another pinned block"],
      "tools": ["clock", "weather"],
      "limits": {"max_steps": 12, "turn_timeout_ms": 300000, "tool_timeout_ms": 30000,
                 "max_reply_bytes": 65536, "max_parallel_tools": 4},
      "context": {"reserve_output_tokens": 4096, "compaction_thresholds": [0.6, 0.75, 0.9],
                  "idle_compaction_after_ms": 600000},
      "admission": {"mode": "queue", "max_queued": 32}
    }
  },
  "tools": {"weather": {"kind": "http", "url": "http://127.0.0.1:9100/weather", "timeout_ms": 5000,
                        "description": "...", "parameters": {"type": "object", "properties": {}}}},
  "channels": {
    "ws": {"enabled": true},
    "webhook": {"targets": {"crm": {"url": "http://127.0.0.1:9200/hook", "timeout_ms": 10000}}},
    "telegram": {"token_env": "TELEGRAM_TOKEN", "api_base": "https://api.telegram.org"},
    "schedules": [{"every_ms": 60000, "session": "cron:report", "agent": "default", "text": "report"}]
  }
})";

// All errors of a parse, one per line, in the order reported.
std::string errors_of(std::string_view text) {
    std::string out;
    for (const auto& e : baton::parse_config(text).errors)
        out += (out.empty() ? "" : "\n") + e.to_string();
    return out;
}

// Sets (or unsets, with nullopt) an environment variable for the scope of a test.
class env_guard {
public:
    env_guard(const char* name, std::optional<std::string> value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        set(value);
    }
    ~env_guard() { set(old_); }

private:
    void set(const std::optional<std::string>& v) {
        if (v)
            ::setenv(name_, v->c_str(), 1);
        else
            ::unsetenv(name_);
    }
    const char* name_;
    std::optional<std::string> old_;
};

} // namespace

BOOST_AUTO_TEST_SUITE(config)

BOOST_AUTO_TEST_CASE(api_example_parses_into_the_structs) {
    auto r = baton::parse_config(api_example);
    BOOST_TEST(errors_of(api_example) == "");
    const baton::config& c = r.cfg;
    BOOST_TEST(c.server.listen == "127.0.0.1:8080");
    BOOST_TEST(c.server.max_body_bytes == 1048576);
    BOOST_TEST_REQUIRE(c.server.tokens.size() == 1u);
    BOOST_TEST(c.server.tokens[0].sha256 ==
               "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    BOOST_TEST(c.server.tokens[0].tenant == "acme");
    BOOST_TEST((c.storage.type == baton::storage_config::kind::sqlite));
    BOOST_TEST(c.storage.sqlite_path == "var/baton.db");
    BOOST_TEST_REQUIRE(c.agents.size() == 1u);
    const baton::agent_config& a = c.agents.at("default");
    BOOST_TEST(a.name == "default");
    BOOST_TEST(a.model.provider == "openai");
    BOOST_TEST(a.model.base_url == "http://127.0.0.1:9000/v1");
    BOOST_TEST(a.model.model == "gpt-4o-mini");
    BOOST_TEST(a.model.timeout.count() == 60000);
    BOOST_TEST(a.model.context_window == 128000);
    BOOST_TEST(a.instructions.size() == 2u);
    BOOST_TEST((a.tools == std::vector<std::string>{"clock", "weather"}));
    BOOST_TEST(a.limits.max_steps == 12);
    BOOST_TEST(a.limits.turn_timeout.count() == 300000);
    BOOST_TEST(a.limits.tool_timeout.count() == 30000);
    BOOST_TEST(a.limits.max_parallel_tools == 4);
    BOOST_TEST((a.context.compaction_thresholds == std::vector<double>{0.6, 0.75, 0.9}));
    BOOST_TEST(a.context.idle_compaction_after.count() == 600000);
    BOOST_TEST((a.admission.mode == baton::admission_mode::queue));
    BOOST_TEST(a.admission.max_queued == 32);
    const baton::tool_config& t = c.tools.at("weather");
    BOOST_TEST(t.url == "http://127.0.0.1:9100/weather");
    BOOST_TEST(t.timeout.count() == 5000);
    BOOST_TEST(t.description == "...");
    BOOST_TEST(c.channels.ws_enabled);
    BOOST_TEST(c.channels.webhook_targets.at("crm").url == "http://127.0.0.1:9200/hook");
    BOOST_TEST(c.channels.webhook_targets.at("crm").timeout.count() == 10000);
    BOOST_TEST(c.channels.telegram_token_env.value_or("") == "TELEGRAM_TOKEN");
    BOOST_TEST_REQUIRE(c.channels.schedules.size() == 1u);
    BOOST_TEST(c.channels.schedules[0].every_ms.value_or(0) == 60000);
    BOOST_TEST(c.channels.schedules[0].session == "cron:report");
    BOOST_TEST(c.channels.schedules[0].text == "report");
}

BOOST_AUTO_TEST_CASE(empty_object_gives_defaults) {
    env_guard model("BATON_MODEL", std::nullopt);
    auto r = baton::parse_config("{}");
    BOOST_TEST(r.errors.empty());
    BOOST_TEST(r.cfg.server.listen == "127.0.0.1:8080");
    BOOST_TEST(r.cfg.server.header_timeout.count() == 10000);
    BOOST_TEST((r.cfg.storage.type == baton::storage_config::kind::sqlite));
    BOOST_TEST_REQUIRE(r.cfg.agents.count("default") == 1u);
    BOOST_TEST(r.cfg.agents.at("default").model.provider == "echo");
    BOOST_TEST(r.cfg.tools.empty());
    BOOST_TEST(baton::parse_config(R"({"agents": {}})").cfg.agents.count("default") == 1u);
}

BOOST_AUTO_TEST_CASE(server_limits_parse_with_their_bounds) {
    auto d = baton::parse_config("{}").cfg.server;
    BOOST_TEST(!d.max_connections_per_ip.has_value()); // the channel picks 1024 or none
    BOOST_TEST(d.body_timeout.count() == 30000);
    BOOST_TEST(d.max_header_bytes == 16384);
    auto r = baton::parse_config(
        R"({"server": {"max_connections_per_ip": 0, "body_timeout_ms": 500, "max_header_bytes": 4096}})");
    BOOST_TEST(r.errors.empty());
    BOOST_TEST(r.cfg.server.max_connections_per_ip.value_or(-1) == 0);
    BOOST_TEST(r.cfg.server.body_timeout.count() == 500);
    BOOST_TEST(r.cfg.server.max_header_bytes == 4096);
    auto bad = errors_of(
        R"({"server": {"max_connections_per_ip": -1, "body_timeout_ms": 0, "max_header_bytes": 100}})");
    BOOST_TEST(bad.find("server.max_connections_per_ip") != std::string::npos, bad);
    BOOST_TEST(bad.find("server.body_timeout_ms") != std::string::npos, bad);
    BOOST_TEST(bad.find("server.max_header_bytes") != std::string::npos, bad);
}

BOOST_AUTO_TEST_CASE(agent_fields_default_and_name_is_the_key) {
    auto r = baton::parse_config(R"({"agents": {"support": {"limits": {"max_steps": 3}}}})");
    BOOST_TEST(errors_of(R"({"agents": {"support": {"limits": {"max_steps": 3}}}})") == "");
    BOOST_TEST(r.cfg.agents.count("default") == 0u);
    const baton::agent_config& a = r.cfg.agents.at("support");
    BOOST_TEST(a.name == "support");
    BOOST_TEST(a.limits.max_steps == 3);
    BOOST_TEST(a.limits.max_parallel_tools == 4);
    BOOST_TEST(a.model.provider == "echo");
}

BOOST_AUTO_TEST_CASE(echo_needs_nothing_openai_needs_model) {
    BOOST_TEST(errors_of(R"({"agents": {"a": {"model": {"provider": "echo"}}}})") == "");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"model": {"provider": "openai"}}}})") ==
               "agents.a.model.model: required");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"model": {"model": "gpt-4o"}}}})") ==
               "agents.a.model.provider: required");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"model": {"provider": "claude"}}}})") ==
               "agents.a.model.provider: expected one of: openai, echo");
}

BOOST_AUTO_TEST_CASE(storage_variants) {
    auto pg = baton::parse_config(R"({"storage": {"postgres": {"conninfo": "host=db dbname=baton"}}})");
    BOOST_TEST(pg.errors.empty());
    BOOST_TEST((pg.cfg.storage.type == baton::storage_config::kind::postgres));
    BOOST_TEST(pg.cfg.storage.postgres_conninfo == "host=db dbname=baton");
    auto mem = baton::parse_config(R"({"storage": {"memory": {}}})");
    BOOST_TEST(mem.errors.empty());
    BOOST_TEST((mem.cfg.storage.type == baton::storage_config::kind::memory));
    BOOST_TEST(errors_of(R"({"storage": {}})") ==
               "storage: expected exactly one of sqlite, postgres, memory");
    BOOST_TEST(errors_of(R"({"storage": {"sqlite": {}, "memory": {}}})") ==
               "storage: expected exactly one of sqlite, postgres, memory");
    BOOST_TEST(errors_of(R"({"storage": {"sqlite": {"synchronous": "fast"}}})") ==
               "storage.sqlite.synchronous: expected one of: off, normal, full");
    BOOST_TEST(errors_of(R"({"storage": {"postgres": {}}})") ==
               "storage.postgres: expected exactly one of conninfo, conninfo_env");
    BOOST_TEST(errors_of(R"({"storage": {"postgres": {"conninfo": "dbname=b", "pool_size": 0}}})") ==
               "storage.postgres.pool_size: must be between 1 and 1000");
    BOOST_TEST(errors_of(R"({"storage": {"postgres": {"conninfo": "host=h password = x"}}})")
                   .starts_with("storage.postgres.conninfo: names a password"));
    BOOST_TEST(errors_of(R"({"storage": {"postgres": {"conninfo": "postgres://u:p@h/d"}}})")
                   .starts_with("storage.postgres.conninfo: names a password"));
    BOOST_TEST(errors_of(R"({"storage": {"postgres": {"conninfo": "postgresql://h/d?password=x"}}})")
                   .starts_with("storage.postgres.conninfo: names a password"));
    BOOST_TEST(
        errors_of(R"({"storage": {"postgres": {"conninfo": "postgresql://u@h/d?sslmode=require"}}})")
            .empty());
    BOOST_TEST(
        errors_of(R"({"storage": {"postgres": {"conninfo": "host=h passwordfile=/x"}}})").empty());
    BOOST_TEST(errors_of(R"({"storage": {"memory": {"x": 1}}})") == "storage.memory.x: unknown key");
}

BOOST_AUTO_TEST_CASE(unknown_keys_have_their_path) {
    BOOST_TEST(errors_of(R"({"agents": {"default": {"limits": {"foo": 1}}}})") ==
               "agents.default.limits.foo: unknown key");
    BOOST_TEST(errors_of(R"({"sever": {}})") == "sever: unknown key");
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"sha256": "", "tenant": "a", "x": 1}]}})") ==
               "server.tokens[0].x: unknown key\nserver.tokens[0].sha256: expected 64 hex characters");
    BOOST_TEST(errors_of(R"({"agents": {"my agent": {"x": 1}}})") ==
               R"(agents["my agent"].x: unknown key)");
}

// Found by a new-user check: every Telegram message and schedule fire was dropped at run time.
BOOST_AUTO_TEST_CASE(a_channel_without_an_agent_needs_the_default_one) {
    BOOST_TEST(errors_of(R"({"agents": {"helper": {}}, "channels": {
        "schedules": [{"every_ms": 60000, "session": "s1", "text": "hi"}],
        "telegram": {"token_env": "TG"}}})") ==
               "channels.telegram.agent: required: the agents do not include \"default\", which a "
               "channel that names none uses\n"
               "channels.schedules[0].agent: required: the agents do not include \"default\", which "
               "a channel that names none uses");
    BOOST_TEST(errors_of(R"({"agents": {"helper": {}}, "channels": {
        "schedules": [{"every_ms": 60000, "session": "s1", "text": "hi", "agent": "helper"}],
        "telegram": {"token_env": "TG", "agent": "helper"}}})") == "");
}

// Found by a new-user check: a NUL cut a path short; a schedule could name a Telegram chat that
// allow_chats refuses, and every fire was refused.
BOOST_AUTO_TEST_CASE(strings_without_nul_and_schedules_to_allowed_chats_only) {
    BOOST_TEST(errors_of(R"({"storage": {"sqlite": {"path": "/tmp/a\u0000b.db"}}})") ==
               "storage.sqlite.path: must not contain a NUL character");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "allow_chats": [1, 2]},
        "schedules": [{"every_ms": 60000, "session": "s", "text": "x",
                       "deliver": {"channel": "telegram", "to": "3"}},
                      {"every_ms": 60000, "session": "s2", "text": "x",
                       "deliver": {"channel": "telegram", "to": "2"}}]}})") ==
               "channels.schedules[0].deliver.to: chat 3 is not in channels.telegram.allow_chats");
}

// Found by a new-user check: a clear-text token no Authorization header can carry was taken.
BOOST_AUTO_TEST_CASE(a_clear_text_token_must_be_sendable) {
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"token": "ab cd", "tenant": "t"}]}})") ==
               "server.tokens[0].token: expected what a Bearer header can carry: letters, digits "
               "and - . _ ~ + /, then = padding only");
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"token": "a,b", "tenant": "t"}]}})") != "");
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"token": "good-token_1", "tenant": "t"}]}})") == "");
}

BOOST_AUTO_TEST_CASE(wrong_types_have_their_path) {
    BOOST_TEST(errors_of(R"({"agents": {"default": {"limits": {"max_steps": "12"}}}})") ==
               "agents.default.limits.max_steps: expected integer");
    BOOST_TEST(errors_of(R"({"agents": {"default": {"limits": {"max_steps": 1.5}}}})") ==
               "agents.default.limits.max_steps: expected integer");
    // A whole number past 64 bits is out of range, not "not an integer".
    BOOST_TEST(errors_of(R"({"tenants": {"a": {"limits": {"tokens_per_day": 1e30}}}})") ==
               "tenants.a.limits.tokens_per_day: must be between 0 and 9223372036854775807");
    BOOST_TEST(
        errors_of(R"({"tenants": {"a": {"limits": {"tokens_per_day": 18446744073709551615}}}})") ==
        "tenants.a.limits.tokens_per_day: must be between 0 and 9223372036854775807");
    BOOST_TEST(errors_of(R"({"agents": {"default": {"limits": {"max_steps": -1e30}}}})")
                   .find("agents.default.limits.max_steps: must be >= 1") == 0u);
    // Durations past ten years overflowed the clock (every request timed out at once).
    BOOST_TEST(errors_of(R"({"server": {"sse_heartbeat_ms": 1e16}})") ==
               "server.sse_heartbeat_ms: must be between 1 and 315360000000");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "debounce_ms": 1e16}}})") ==
               "channels.telegram.debounce_ms: must be between 0 and 315360000000");
    BOOST_TEST(errors_of(R"({"server": {"idle_timeout_ms": 315360000000}})") == "");
    BOOST_TEST(errors_of(R"({"server": {"listen": 8080}})") == "server.listen: expected string");
    BOOST_TEST(errors_of(R"({"channels": {"ws": {"enabled": "yes"}}})") ==
               "channels.ws.enabled: expected boolean");
    BOOST_TEST(errors_of(R"({"server": []})") == "server: expected object");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"instructions": "be nice"}}})") ==
               "agents.a.instructions: expected array");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"instructions": ["ok", 2]}}})") ==
               "agents.a.instructions[1]: expected string");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"context": {"compaction_thresholds": [0.5, "x"]}}}})") ==
               "agents.a.context.compaction_thresholds[1]: expected number");
    BOOST_TEST(errors_of("[]") == "the config must be a JSON object");
    // 1e3 is a whole number, so it is accepted as an integer.
    BOOST_TEST(baton::parse_config(R"({"server": {"threads": 1e1}})").cfg.server.threads == 10);
}

BOOST_AUTO_TEST_CASE(ranges) {
    BOOST_TEST(errors_of(R"({"server": {"threads": -1}})") ==
               "server.threads: must be between 0 and 1024");
    BOOST_TEST(errors_of(R"({"server": {"max_body_bytes": 0}})") ==
               "server.max_body_bytes: must be >= 1");
    BOOST_TEST(errors_of(R"({"server": {"idle_timeout_ms": 0}})") ==
               "server.idle_timeout_ms: must be between 1 and 315360000000");
    BOOST_TEST(
        errors_of(R"({"agents": {"a": {"limits": {"max_steps": 0, "max_parallel_tools": 0}}}})") ==
        "agents.a.limits.max_steps: must be >= 1\nagents.a.limits.max_parallel_tools: must be >= 1");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"model": {"provider": "echo", "timeout_ms": 0}}}})") ==
               "agents.a.model.timeout_ms: must be between 1 and 315360000000");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"admission": {"max_queued": -1}}}})") ==
               "agents.a.admission.max_queued: must be >= 0");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"admission": {"max_queued": 0, "mode": "drop"}}}})") ==
               "agents.a.admission.mode: expected one of: queue, collect, steer, interrupt, reject");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"context": {"compaction_thresholds": [0.5, 1.5]}}}})") ==
               "agents.a.context.compaction_thresholds[1]: must be in (0, 1]");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"context": {"compaction_thresholds": [0.8, 0.6]}}}})") ==
               "agents.a.context.compaction_thresholds[1]: must be greater than the previous threshold");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"context": {"compaction_thresholds": [0, 1]}}}})") ==
               "agents.a.context.compaction_thresholds[0]: must be in (0, 1]");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"context": {"reserve_output_tokens": 8000},
                                              "model": {"provider": "echo", "context_window": 8000}}}})") ==
               "agents.a.context.reserve_output_tokens: must be less than model.context_window (8000)");
}

BOOST_AUTO_TEST_CASE(server_listen_and_tokens) {
    for (const char* ok : {"127.0.0.1:0", "0.0.0.0:65535", "[::1]:8080", "localhost:80"})
        BOOST_TEST(errors_of(std::string(R"({"server": {"listen": ")") + ok + "\"}}") == "", ok);
    // Names other than localhost are refused here, as `baton serve` would refuse them at start.
    for (const char* bad : {"127.0.0.1", "127.0.0.1:65536", ":80", "::1:80", "host:http", "host:-1",
                            "999.1.1.1:80", "example.com:80", "[nonsense]:80", "1.2.3:80"})
        BOOST_TEST(
            errors_of(std::string(R"({"server": {"listen": ")") + bad + "\"}}") ==
                "server.listen: expected IP:PORT (an IPv4 address, [IPv6] or localhost; port 0..65535)",
            bad);
    // Loopback: what may be listened on without tokens (and without the config's warning).
    for (const char* lo :
         {"127.0.0.1:0", "127.1.2.3:80", "[::1]:0", "localhost:1", "[::ffff:127.0.0.1]:0"})
        BOOST_TEST(baton::loopback_listen_address(lo), lo);
    for (const char* remote : {"0.0.0.0:80", "[::]:80", "[::ffff:10.0.0.1]:80", "10.0.0.1:80", "foo",
                               "127.0.0.1:99999", "[::1]"})
        BOOST_TEST(!baton::loopback_listen_address(remote), remote);
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"sha256": "abc", "tenant": "t"}]}})") ==
               "server.tokens[0].sha256: expected 64 hex characters");
    std::string hash(64, 'a');
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"sha256": ")" + hash + R"("}]}})") ==
               "server.tokens[0].tenant: required");
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{"sha256": ")" + hash + R"(", "tenant": "a"},
                                                  {"sha256": ")" +
                         hash + R"(", "tenant": "b"}]}})") ==
               "server.tokens[1].sha256: duplicate token");
}

BOOST_AUTO_TEST_CASE(tools_and_agent_tool_references) {
    BOOST_TEST(
        errors_of(R"({"tools": {"t": {"kind": "http", "url": "ftp://x"}}})") ==
        "tools.t.url: expected an http:// or https:// URL with a host (and a port of 1-65535 if any)");
    BOOST_TEST(errors_of(R"({"tools": {"t": {"kind": "http"}}})") == "tools.t.url: required");
    BOOST_TEST(errors_of(R"({"tools": {"t": {"kind": "shell"}}})") ==
               "tools.t.kind: expected one of: http");
    BOOST_TEST(errors_of(R"({"tools": {"t": {"url": "https://x", "parameters": []}}})") ==
               "tools.t.parameters: expected object");
    BOOST_TEST(errors_of(R"({"tools": {"clock": {"url": "https://x"}}})") ==
               "tools.clock: name is taken by a builtin tool");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"tools": ["clock", "weather"]}}})") ==
               R"(agents.a.tools[1]: unknown tool "weather")");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"tools": ["clock", "clock"]}}})") ==
               R"(agents.a.tools[1]: duplicate tool "clock")");
}

BOOST_AUTO_TEST_CASE(channels) {
    BOOST_TEST(
        errors_of(R"({"channels": {"webhook": {"targets": {"crm": {"url": "x"}}}}})") ==
        "channels.webhook.targets.crm.url: expected an http:// or https:// URL with a host (and a port "
        "of 1-65535 if any)");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {}}})") ==
               "channels.telegram.token_env: required");
    BOOST_TEST(
        errors_of(R"({"channels": {"webhook": {"max_concurrency": 0, "targets": {"crm": {)"
                  R"("url": "http://h/x", "headers": {"X-Ok": "1", "Bad Name": "v", "X-N": 1}}}}}})") ==
        "channels.webhook.max_concurrency: must be between 1 and 1024\n"
        "channels.webhook.targets.crm.headers[\"Bad Name\"]: header name must be letters, digits, "
        "'-' or '_'\nchannels.webhook.targets.crm.headers.X-N: expected string");
    auto hook = baton::parse_config(
        R"({"channels": {"webhook": {"targets": {"crm": {"url": "http://h/x", "headers": {"Authorization": "Bearer t"}}}}}})");
    BOOST_TEST(hook.errors.empty());
    BOOST_TEST(hook.cfg.channels.webhook_targets.at("crm").headers.at("Authorization") == "Bearer t");
    // Found by a new-user check: the headers baton sets were sent twice, and X-A beside x-a.
    BOOST_TEST(errors_of(R"({"channels": {"webhook": {"targets": {"crm": {"url": "http://h/x", )"
                         R"("headers": {"Content-Type": "text/plain", "X-A": "1", "x-a": "2"}}}}}})") ==
               "channels.webhook.targets.crm.headers.Content-Type: set by baton for every delivery; "
               "not a target header\n"
               "channels.webhook.targets.crm.headers.x-a: given twice (header names are "
               "case-insensitive)");
    BOOST_TEST(errors_of(R"({"agents": {"a": {"on_abandoned": "retry"}}})") ==
               "agents.a.on_abandoned: expected one of: fail, rerun");
    BOOST_TEST(baton::parse_config(R"({"agents": {"a": {"on_abandoned": "rerun"}}})")
                   .cfg.agents.at("a")
                   .rerun_abandoned);
    auto tg = baton::parse_config(
        R"({"channels": {"telegram": {"token_env": "T", "allow_chats": [-1001, "7"]}}})");
    BOOST_TEST(tg.errors.empty());
    BOOST_TEST((tg.cfg.channels.telegram_allow_chats == std::vector<std::string>{"-1001", "7"}));
    BOOST_TEST(tg.cfg.channels.telegram_agent == "default");
    BOOST_TEST(tg.cfg.channels.telegram_debounce.count() == 0);
    BOOST_TEST(tg.cfg.channels.telegram_send_interval.count() == 1000);
    BOOST_TEST(tg.cfg.channels.telegram_poll_timeout_s == 25);
    auto tg2 = baton::parse_config(
        R"({"agents": {"a": {}}, "channels": {"telegram": {"token_env": "T", "agent": "a",)"
        R"( "debounce_ms": 1500, "send_interval_ms": 0, "poll_timeout_s": 1}}})");
    BOOST_TEST(tg2.errors.empty());
    BOOST_TEST(tg2.cfg.channels.telegram_agent == "a");
    BOOST_TEST(tg2.cfg.channels.telegram_debounce.count() == 1500);
    BOOST_TEST(tg2.cfg.channels.telegram_send_interval.count() == 0);
    BOOST_TEST(tg2.cfg.channels.telegram_poll_timeout_s == 1);
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "agent": "nobody"}}})") ==
               R"(channels.telegram.agent: unknown agent "nobody")");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "debounce_ms": -1}}})") ==
               "channels.telegram.debounce_ms: must be between 0 and 315360000000");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "poll_timeout_s": 51}}})") ==
               "channels.telegram.poll_timeout_s: must be between 1 and 50");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "poll_timeout_s": 0}}})") ==
               "channels.telegram.poll_timeout_s: must be between 1 and 50");
    BOOST_TEST(errors_of(R"({"channels": {"telegram": {"token_env": "T", "debounce": 1}}})") ==
               "channels.telegram.debounce: unknown key");
    auto sched = [](std::string body) {
        return errors_of(R"({"channels": {"schedules": [)" + body + "]}}");
    };
    BOOST_TEST(sched(R"({"cron": "0 * * * *", "session": "s", "text": "t"})") == "");
    BOOST_TEST(sched(R"({"session": "s", "text": "t"})") ==
               "channels.schedules[0]: expected exactly one of every_ms, cron");
    BOOST_TEST(sched(R"({"every_ms": 1, "cron": "* * * * *", "session": "s", "text": "t"})") ==
               "channels.schedules[0]: expected exactly one of every_ms, cron");
    BOOST_TEST(sched(R"({"every_ms": 1000})") ==
               "channels.schedules[0].session: required\nchannels.schedules[0].text: required");
    BOOST_TEST(sched(R"({"every_ms": 1000, "session": "a b", "text": "t"})") ==
               "channels.schedules[0].session: expected 1-128 characters of [A-Za-z0-9._:@-]");
    BOOST_TEST(sched(R"({"every_ms": 1000, "session": "s", "text": "t", "agent": "nobody"})") ==
               R"(channels.schedules[0].agent: unknown agent "nobody")");
}

BOOST_AUTO_TEST_CASE(every_error_is_reported) {
    auto r = baton::parse_config(R"({
        "server": {"threads": "four", "bogus": true},
        "storage": {"sqlite": {"path": 1}},
        "agents": {"default": {"limits": {"max_steps": 0}, "tools": ["nope"]}},
        "channels": {"schedules": [{"every_ms": 10, "session": "s"}]}
    })");
    std::vector<std::string> got;
    for (const auto& e : r.errors)
        got.push_back(e.to_string());
    std::vector<std::string> want{"server.bogus: unknown key",
                                  "server.threads: expected integer",
                                  "storage.sqlite.path: expected string",
                                  R"(agents.default.tools[0]: unknown tool "nope")",
                                  "agents.default.limits.max_steps: must be >= 1",
                                  "channels.schedules[0].text: required"};
    BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(json_syntax_errors_and_duplicate_keys) {
    auto r = baton::parse_config("{\n  \"server\": {\"threads\": 1,}\n}");
    BOOST_TEST_REQUIRE(r.errors.size() == 1u);
    BOOST_TEST(r.errors[0].path == "");
    BOOST_TEST(r.errors[0].message.find("line 2, column") != std::string::npos, r.errors[0].message);
    BOOST_TEST(errors_of("{} x").find("invalid JSON at line 1, column 4") == 0u, errors_of("{} x"));
    BOOST_TEST(errors_of("").find("invalid JSON at line 1, column 1") == 0u);
    BOOST_TEST(errors_of(R"({"agents": {"a": {"limits": {"max_steps": 1, "max_steps": 2}}}})") ==
               "agents.a.limits.max_steps: duplicate key");
    BOOST_TEST(errors_of(R"({"server": {"tokens": [{}, {"tenant": "a", "tenant": "b"}]}})")
                   .find("server.tokens[1].tenant: duplicate key") == 0u);
}

BOOST_AUTO_TEST_CASE(admission_mode_names_round_trip) {
    for (auto m :
         {baton::admission_mode::queue, baton::admission_mode::collect, baton::admission_mode::steer,
          baton::admission_mode::interrupt, baton::admission_mode::reject})
        BOOST_TEST((baton::parse_admission_mode(baton::to_string(m)) == m));
    BOOST_TEST(baton::to_string(baton::admission_mode::steer) == "steer");
    BOOST_TEST(!baton::parse_admission_mode("Queue").has_value());
}

BOOST_AUTO_TEST_CASE(load_config_file_reads_or_explains) {
    auto missing = baton::load_config_file("/nonexistent/baton.json");
    BOOST_TEST_REQUIRE(missing.errors.size() == 1u);
    BOOST_TEST(missing.errors[0].to_string() ==
               "cannot read /nonexistent/baton.json: No such file or directory");
    std::string path = "/tmp/baton_config_test_" + std::to_string(::getpid()) + ".json";
    { std::ofstream(path) << R"({"server": {"listen": "127.0.0.1:0"}})"; }
    auto r = baton::load_config_file(path);
    std::remove(path.c_str());
    BOOST_TEST(r.errors.empty());
    BOOST_TEST(r.cfg.server.listen == "127.0.0.1:0");
}

BOOST_AUTO_TEST_CASE(default_config_follows_baton_model) {
    env_guard base("BATON_MODEL_BASE_URL", std::nullopt);
    {
        env_guard model("BATON_MODEL", std::nullopt);
        auto c = baton::default_config();
        BOOST_TEST(c.agents.at("default").model.provider == "echo");
        BOOST_TEST(c.agents.at("default").name == "default");
        BOOST_TEST((c.storage.type == baton::storage_config::kind::sqlite));
        BOOST_TEST(c.storage.sqlite_path == "var/baton.db");
    }
    {
        env_guard model("BATON_MODEL", "echo");
        BOOST_TEST(baton::default_config().agents.at("default").model.provider == "echo");
    }
    {
        env_guard model("BATON_MODEL", "openai:gpt-4o-mini");
        auto m = baton::default_config().agents.at("default").model;
        BOOST_TEST(m.provider == "openai");
        BOOST_TEST(m.model == "gpt-4o-mini");
        BOOST_TEST(m.base_url == "https://api.openai.com/v1");
        env_guard url("BATON_MODEL_BASE_URL", "http://127.0.0.1:11434/v1");
        BOOST_TEST(baton::default_config().agents.at("default").model.base_url ==
                   "http://127.0.0.1:11434/v1");
        // A config file without agents gets the same default agent.
        BOOST_TEST(baton::parse_config("{}").cfg.agents.at("default").model.model == "gpt-4o-mini");
    }
    for (const char* bad : {"gpt-4o", "openai:", "anthropic:claude"}) {
        env_guard model("BATON_MODEL", bad);
        BOOST_CHECK_THROW(baton::default_config(), std::invalid_argument);
        BOOST_TEST(errors_of("{}") == "BATON_MODEL: expected `echo` or `openai:<model>`");
    }
}

BOOST_AUTO_TEST_SUITE_END()
