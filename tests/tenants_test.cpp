// Bearer tokens and tenants (docs/api.md "Security"): the parsers and the authenticator on their
// own, then a real daemon with three tokens of three tenants, driven over HTTP, SSE and WebSocket
// as clients would: every 401 and 403, and every cross-tenant answer a 404.
#include "tests/daemon_fixture.hpp"
#include "tests/pg_test.hpp"
#include "tests/ws_client.hpp"

#include <baton/auth.hpp>
#include <baton/config.hpp>

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <set>
#include <thread>

using namespace baton;
using namespace baton::test;
namespace json = boost::json;

BOOST_AUTO_TEST_SUITE(auth)

BOOST_AUTO_TEST_CASE(bearer_header_parsing) {
    BOOST_TEST(parse_bearer("Bearer abc").value_or("") == "abc");
    BOOST_TEST(parse_bearer("bearer   abc  ").value_or("") == "abc");
    BOOST_TEST(parse_bearer("BEARER a-b.c_d~e+f/g==").value_or("") == "a-b.c_d~e+f/g==");
    BOOST_TEST(!parse_bearer("Basic YWxhZGRpbjpvcGVuc2VzYW1l"));
    BOOST_TEST(!parse_bearer("Bearer"));
    BOOST_TEST(!parse_bearer("Bearer "));
    BOOST_TEST(!parse_bearer("Bearerabc"));
    BOOST_TEST(!parse_bearer("Bearer a b"));
    BOOST_TEST(!parse_bearer("Bearer =abc"));
    BOOST_TEST(!parse_bearer("Bearer ab=c"));
    BOOST_TEST(!parse_bearer(""));
}

BOOST_AUTO_TEST_CASE(websocket_subprotocol_parsing) {
    auto o = parse_ws_protocols("baton.v1, bearer.bt_xyz-_");
    BOOST_TEST(o.baton_v1);
    BOOST_TEST(o.token.value_or("") == "bt_xyz-_");
    BOOST_TEST(!o.malformed);
    o = parse_ws_protocols("bearer.");
    BOOST_TEST(!o.token);
    BOOST_TEST(!o.baton_v1);
    o = parse_ws_protocols(" chat ,, bearer.t1 ");
    BOOST_TEST(o.token.value_or("") == "t1");
    BOOST_TEST(!o.baton_v1);
    o = parse_ws_protocols("bearer.a b");
    BOOST_TEST(o.malformed);
    BOOST_TEST(!o.token);
}

BOOST_AUTO_TEST_CASE(made_tokens_are_random_base64url) {
    std::set<std::string> seen;
    for (int i = 0; i < 50; ++i) {
        auto t = make_token();
        BOOST_TEST(t.size() == 46u);
        BOOST_TEST(t.starts_with("bt_"));
        BOOST_TEST(
            t.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", 3) ==
            std::string::npos);
        // Usable both ways a client can send it.
        BOOST_TEST(parse_bearer("Bearer " + t).value_or("") == t);
        BOOST_TEST(parse_ws_protocols("bearer." + t).token.value_or("") == t);
        seen.insert(t);
    }
    BOOST_TEST(seen.size() == 50u);
}

BOOST_AUTO_TEST_CASE(authenticator_finds_the_tenant_and_scopes) {
    auto a = make_token(), b = make_token();
    std::vector<token_config> tokens{{sha256_hex(a), "acme", {"tenant"}},
                                     {sha256_hex(b), "ops", {"admin"}}};
    authenticator auth(tokens);
    BOOST_TEST(auth.enabled());
    auto who = auth.authenticate(a);
    BOOST_TEST_REQUIRE(who.has_value());
    BOOST_TEST(who->tenant == "acme");
    BOOST_TEST(who->tenant_scope);
    BOOST_TEST(!who->admin);
    who = auth.authenticate(b);
    BOOST_TEST_REQUIRE(who.has_value());
    BOOST_TEST(who->admin);
    BOOST_TEST(!who->tenant_scope);
    BOOST_TEST(!auth.authenticate(a + "x"));
    BOOST_TEST(!auth.authenticate(""));
    BOOST_TEST(!auth.authenticate(sha256_hex(a))); // the hash is not the token
    BOOST_TEST(!authenticator().enabled());
}

std::string errors_of(const config_result& r) {
    std::string out;
    for (const auto& e : r.errors)
        out += e.to_string() + "\n";
    return out;
}

BOOST_AUTO_TEST_CASE(config_tokens_scopes_tenants_and_warnings) {
    std::string hash(64, 'a');
    auto r =
        parse_config(R"({"server": {"tokens": [{"sha256": ")" + hash +
                     R"(", "tenant": "acme", "scopes": ["tenant", "admin"]}], "metrics_public": true},
        "tenants": {"acme": {"limits": {"max_running_turns": 2, "turns_per_minute": 60, "tokens_per_day": 1000}}},
        "channels": {"telegram": {"token_env": "T", "tenant": "acme"},
                     "schedules": [{"every_ms": 1000, "session": "s", "text": "x", "tenant": "acme"}]}})");
    BOOST_TEST_REQUIRE(r.errors.empty(), errors_of(r));
    BOOST_TEST(r.warnings.empty());
    BOOST_TEST(r.cfg.server.tokens[0].scopes == (std::vector<std::string>{"tenant", "admin"}));
    BOOST_TEST(r.cfg.server.metrics_public);
    BOOST_TEST(r.cfg.tenants.at("acme").limits.max_running_turns == 2);
    BOOST_TEST(r.cfg.tenants.at("acme").limits.turns_per_minute == 60);
    BOOST_TEST(r.cfg.tenants.at("acme").limits.tokens_per_day == 1000);
    BOOST_TEST(r.cfg.channels.telegram_tenant == "acme");
    BOOST_TEST(r.cfg.channels.schedules[0].tenant == "acme");

    // Scopes absent: the tenant scope alone.
    r = parse_config(R"({"server": {"tokens": [{"sha256": ")" + hash + R"(", "tenant": "a"}]}})");
    BOOST_TEST(r.cfg.server.tokens[0].scopes == (std::vector<std::string>{"tenant"}));

    r = parse_config(
        R"({"server": {"tokens": [{"sha256": ")" + hash +
        R"(", "tenant": "a b", "scopes": ["root", 1]}]}, "tenants": {"x/y": {"limits": {"max_running_turns": -3}}, "t": {"limits": {"turns_per_minute": -1, "burst": 2}}}})");
    auto errors = errors_of(r);
    BOOST_TEST(errors.find("server.tokens[0].tenant: expected 1-64 characters") != std::string::npos,
               errors);
    BOOST_TEST(errors.find("server.tokens[0].scopes[0]: expected \"tenant\" or \"admin\"") !=
                   std::string::npos,
               errors);
    BOOST_TEST(errors.find("server.tokens[0].scopes[1]") != std::string::npos, errors);
    BOOST_TEST(errors.find("tenants[\"x/y\"]: a tenant name is") != std::string::npos, errors);
    // A bad name's body is checked too: every error at once.
    BOOST_TEST(errors.find("tenants[\"x/y\"].limits.max_running_turns") != std::string::npos, errors);
    BOOST_TEST(errors.find("tenants.t.limits.turns_per_minute") != std::string::npos, errors);
    BOOST_TEST(errors.find("tenants.t.limits.burst: unknown key") != std::string::npos, errors);

    // A token in clear text is taken (hashed) with a warning that never repeats it.
    r = parse_config(R"({"server": {"tokens": [{"token": "bt_secret-value", "tenant": "a"}]}})");
    BOOST_TEST_REQUIRE(r.errors.empty(), errors_of(r));
    BOOST_TEST(r.cfg.server.tokens[0].sha256 == sha256_hex("bt_secret-value"));
    BOOST_TEST_REQUIRE(r.warnings.size() == 1u);
    BOOST_TEST(r.warnings[0].path == "server.tokens[0].token");
    BOOST_TEST(r.warnings[0].message.find("bt_secret") == std::string::npos);
    r = parse_config(R"({"server": {"tokens": [{"token": "x", "sha256": ")" + hash +
                     R"(", "tenant": "a"}]}})");
    BOOST_TEST(errors_of(r).find("server.tokens[0]: expected exactly one of sha256, token") !=
               std::string::npos);

    // Tokens on a non-loopback address without TLS: a warning, not an error.
    r = parse_config(R"({"server": {"listen": "0.0.0.0:8080", "tokens": [{"sha256": ")" + hash +
                     R"(", "tenant": "a"}]}})");
    BOOST_TEST_REQUIRE(r.errors.empty(), errors_of(r));
    BOOST_TEST_REQUIRE(r.warnings.size() == 1u);
    BOOST_TEST(r.warnings[0].path == "server.listen");
    r = parse_config(
        R"({"server": {"listen": "0.0.0.0:8080", "tls": {"cert_file": "c.pem", "key_file": "k.pem"},
                        "tokens": [{"sha256": ")" +
        hash + R"(", "tenant": "a"}]}})");
    BOOST_TEST(r.warnings.empty());
    BOOST_TEST(r.cfg.server.tls->cert_file == "c.pem");
    r = parse_config(R"({"server": {"tls": {"cert_file": ""}}})");
    errors = errors_of(r);
    BOOST_TEST(errors.find("server.tls.key_file: required") != std::string::npos, errors);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

header_list bearer(const std::string& token) {
    return {{"Authorization", "Bearer " + token}};
}

const header_list upgrade_headers{{"Upgrade", "websocket"},
                                  {"Connection", "Upgrade"},
                                  {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="},
                                  {"Sec-WebSocket-Version", "13"}};

// BATON_TEST_TENANTS_ON_PG=1 (ctest's tenants_daemon_postgres): the daemon keeps everything in
// the PostgreSQL test cluster, as a node of a cluster (a schema of its own per case).
std::unique_ptr<pg_schema> tenants_schema() {
    const char* on = std::getenv("BATON_TEST_TENANTS_ON_PG");
    if (!on || std::string(on) != "1") return nullptr;
    if (test_pg().empty()) {
        BOOST_TEST_MESSAGE("BATON_TEST_PG is not set: the PostgreSQL run of the tenant cases is "
                           "skipped (they run on SQLite)");
        return nullptr;
    }
    return std::make_unique<pg_schema>();
}

struct tenants_fixture : daemon_fixture {
    issued a, b, ops;
    std::unique_ptr<pg_schema> schema = tenants_schema();
    explicit tenants_fixture(std::string extra_server = "") : daemon_fixture(deferred{}) {
        a = new_token({"--tenant", "a"});
        b = new_token({"--tenant", "b"});
        ops = new_token({"--tenant", "ops", "--scope", "admin"});
        std::string storage;
        if (schema)
            storage = json::serialize(json::object{
                          {"postgres", {{"conninfo", schema->conninfo()}, {"cluster", true}}}}) +
                      ", ";
        auto cfg = write_file("baton.json", (schema ? R"({"storage": )" + storage : std::string("{")) +
                                                R"("server": {)" + extra_server + R"("tokens": [)" +
                                                a.entry + "," + b.entry + "," + ops.entry + "]}}");
        start({"--config", cfg.string()});
    }
    std::string post(const issued& who, const std::string& sid, const std::string& text,
                     header_list extra = {}) {
        auto h = bearer(who.token);
        h.insert(h.end(), extra.begin(), extra.end());
        auto r = request("POST", "/v1/sessions/" + sid + "/messages",
                         json::serialize(json::object{{"text", text}}), h);
        BOOST_TEST_REQUIRE((r.status == 202 || r.status == 200), r.body);
        return std::string(r.json.at("turn_id").as_string());
    }
};

struct public_metrics_fixture : tenants_fixture {
    public_metrics_fixture() : tenants_fixture(R"("metrics_public": true, )") {}
};

} // namespace

BOOST_AUTO_TEST_SUITE(tenants_daemon)

BOOST_FIXTURE_TEST_CASE(every_v1_call_needs_a_valid_token, tenants_fixture) {
    auto tid = post(a, "s1", "hello");
    wait_for_turn(tid, bearer(a.token));
    const std::vector<std::pair<std::string, std::string>> calls{
        {"POST", "/v1/sessions/s1/messages"},
        {"GET", "/v1/turns/" + tid},
        {"GET", "/v1/turns/" + tid + "/events"},
        {"POST", "/v1/turns/" + tid + "/cancel"},
        {"GET", "/v1/sessions/s1"},
        {"GET", "/v1/sessions/s1/tape"},
        {"GET", "/v1/outbox"},
        {"GET", "/v1/ws"},
        {"GET", "/v1/no-such-thing"},
        {"DELETE", "/v1/sessions/s1"},
        {"GET", "/metrics"}};
    for (const auto& [method, target] : calls) {
        std::string body = method == "POST" ? R"({"text":"x"})" : "";
        auto none = request(method, target, body);
        BOOST_TEST(none.status == 401u, method << " " << target << ": " << none.body);
        BOOST_TEST(none.json.at("error").at("code").as_string() == "unauthorized");
        BOOST_TEST(none.header("WWW-Authenticate").value_or("") == R"(Bearer realm="baton")");
        auto wrong = request(method, target, body, bearer(a.token + "x"));
        BOOST_TEST(wrong.status == 401u, method << " " << target);
        BOOST_TEST(wrong.header("WWW-Authenticate").value_or("").find(R"(error="invalid_token")") !=
                   std::string::npos);
        auto basic = request(method, target, body, {{"Authorization", "Basic " + a.token}});
        BOOST_TEST(basic.status == 401u, method << " " << target);
        // Nothing about a token is echoed.
        BOOST_TEST(wrong.body.find(a.token) == std::string::npos);
    }
    // The WebSocket upgrade itself.
    auto up = request("GET", "/v1/ws", "", upgrade_headers);
    BOOST_TEST(up.status == 401u);
    auto h = upgrade_headers;
    h.emplace_back("Sec-WebSocket-Protocol", "baton.v1, bearer.wrong");
    BOOST_TEST(request("GET", "/v1/ws", "", h).status == 401u);
    // What stays open.
    BOOST_TEST(request("GET", "/healthz").status == 200u);
    BOOST_TEST(request("GET", "/readyz").status == 200u);
    BOOST_TEST(request("GET", "/").status == 200u);
    // No token, wrong or right, reaches the log.
    BOOST_TEST(log().find(a.token) == std::string::npos);
    BOOST_TEST(log().find(b.token) == std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(scopes_decide_admin_and_tenant_resources, tenants_fixture) {
    // A tenant token: not the outbox listing, not /metrics.
    auto r = request("GET", "/v1/outbox", "", bearer(a.token));
    BOOST_TEST(r.status == 403u);
    BOOST_TEST(r.json.at("error").at("code").as_string() == "forbidden");
    BOOST_TEST(r.header("WWW-Authenticate").value_or("").find(R"(scope="admin")") != std::string::npos);
    BOOST_TEST(request("GET", "/metrics", "", bearer(a.token)).status == 403u);
    // The admin token: both, but no sessions of its own.
    BOOST_TEST(request("GET", "/v1/outbox", "", bearer(ops.token)).status == 200u);
    auto m = request("GET", "/metrics", "", bearer(ops.token));
    BOOST_TEST(m.status == 200u);
    BOOST_TEST(m.body.find("baton_turns_total") != std::string::npos);
    r = request("POST", "/v1/sessions/s1/messages", R"({"text":"x"})", bearer(ops.token));
    BOOST_TEST(r.status == 403u);
    BOOST_TEST(r.header("WWW-Authenticate").value_or("").find(R"(scope="tenant")") != std::string::npos);
    auto h = upgrade_headers;
    h.emplace_back("Authorization", "Bearer " + ops.token);
    BOOST_TEST(request("GET", "/v1/ws", "", h).status == 403u);
}

BOOST_FIXTURE_TEST_CASE(metrics_can_be_public, public_metrics_fixture) {
    BOOST_TEST(request("GET", "/metrics").status == 200u);
    BOOST_TEST(request("GET", "/v1/outbox").status == 401u);
}

BOOST_FIXTURE_TEST_CASE(tenants_never_see_each_other_over_http, tenants_fixture) {
    // One session id, two tenants: two sessions.
    auto ta = post(a, "s1", "from a", {{"Idempotency-Key", "same-key"}});
    auto tb = post(b, "s1", "from b", {{"Idempotency-Key", "same-key"}});
    BOOST_TEST(ta != tb);
    wait_for_turn(ta, bearer(a.token));
    wait_for_turn(tb, bearer(b.token));
    auto tape_a = request("GET", "/v1/sessions/s1/tape", "", bearer(a.token));
    auto tape_b = request("GET", "/v1/sessions/s1/tape", "", bearer(b.token));
    BOOST_TEST(tape_a.body.find("from a") != std::string::npos);
    BOOST_TEST(tape_a.body.find("from b") == std::string::npos);
    BOOST_TEST(tape_b.body.find("from b") != std::string::npos);
    BOOST_TEST(tape_b.body.find("from a") == std::string::npos);
    BOOST_TEST(request("GET", "/v1/sessions/s1", "", bearer(a.token)).json.at("turns").as_int64() == 1);
    // The key replays within its tenant only.
    auto again = request("POST", "/v1/sessions/s1/messages", R"({"text":"from a"})",
                         {{"Authorization", "Bearer " + a.token}, {"Idempotency-Key", "same-key"}});
    BOOST_TEST(again.status == 200u);
    BOOST_TEST(again.json.at("turn_id").as_string() == ta);

    // Everything of a's answers b as if it did not exist: 404, never 403.
    auto only_a = post(a, "only-a", "private");
    wait_for_turn(only_a, bearer(a.token));
    const std::vector<std::pair<std::string, std::string>> calls{
        {"GET", "/v1/turns/" + only_a},
        {"GET", "/v1/turns/" + only_a + "/events"},
        {"POST", "/v1/turns/" + only_a + "/cancel"},
        {"GET", "/v1/sessions/only-a"},
        {"GET", "/v1/sessions/only-a/tape"}};
    for (const auto& [method, target] : calls) {
        auto theirs = request(method, target, "", bearer(b.token));
        BOOST_TEST(theirs.status == 404u, method << " " << target << ": " << theirs.body);
        BOOST_TEST(theirs.json.at("error").at("code").as_string() == "not_found");
        BOOST_TEST(theirs.body.find("private") == std::string::npos);
        // The same answer as for something that never existed.
        auto unknown = request(method, target == "/v1/sessions/only-a" ? "/v1/sessions/never" : target,
                               "", bearer(b.token));
        BOOST_TEST(unknown.status == 404u);
    }
    // Its owner still sees it (cancel: already finished).
    BOOST_TEST(request("GET", "/v1/turns/" + only_a, "", bearer(a.token)).status == 200u);
    BOOST_TEST(request("POST", "/v1/turns/" + only_a + "/cancel", "", bearer(a.token)).status == 409u);
    // Its owner follows its events.
    auto sse = connect();
    BOOST_TEST_REQUIRE(
        sse.write(format_request("GET", "/v1/turns/" + only_a + "/events", {}, bearer(a.token))));
    auto events = sse.read_response();
    BOOST_TEST_REQUIRE(events.has_value());
    BOOST_TEST(events->status == 200u);
    BOOST_TEST(events->body.find("turn.finished") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(tenants_never_see_each_other_over_websocket, tenants_fixture) {
    // b follows s1 with its token in the header; a (the way a browser does) as a subprotocol.
    ws_client wb(daemon->host(), daemon->port(), {{"Authorization", "Bearer " + b.token}});
    ws_client wa(daemon->host(), daemon->port(),
                 {{"Sec-WebSocket-Protocol", "baton.v1, bearer." + a.token}});
    BOOST_TEST(wa.protocol() == "baton.v1"); // never the token
    BOOST_TEST(wb.protocol() == "");
    wb.send({{"type", "subscribe"}, {"session", "s1"}});
    wa.send({{"type", "message"}, {"session", "s1"}, {"text", "a's secret"}, {"id", "c-1"}});
    auto accepted = wa.read_until(frame_type("accepted"));
    std::string tid(accepted.at("turn_id").as_string());
    auto reply = wa.read_until(frame_type("reply"));
    BOOST_TEST(reply.at("text").as_string() == "echo: a's secret");
    std::string key(reply.at("key").as_string());
    wa.read_until(event_named("turn.finished", tid));
    // A turn of b's own s1 reaches b, and b has seen nothing of a's.
    auto tb = post(b, "s1", "b's own");
    wb.read_until(event_named("turn.finished", tb));
    wb.barrier();
    for (const auto& f : wb.seen) {
        auto text = json::serialize(f);
        BOOST_TEST(text.find(tid) == std::string::npos, text);
        BOOST_TEST(text.find("secret") == std::string::npos, text);
    }
    // Frames naming a's things answer b not_found: ack, cancel.
    wb.send({{"type", "ack"}, {"key", key}, {"id", "x-1"}});
    auto err = wb.read_until(frame_type("error"));
    BOOST_TEST(err.at("code").as_string() == "not_found");
    BOOST_TEST(err.at("id").as_string() == "x-1");
    wb.send({{"type", "cancel"}, {"turn_id", tid}, {"id", "x-2"}});
    err = wb.read_until(frame_type("error"));
    BOOST_TEST(err.at("code").as_string() == "not_found");
    // a's reply is still unacked (b's ack did nothing): a sees it again on a new subscribe.
    ws_client wa2(daemon->host(), daemon->port(), {{"Authorization", "Bearer " + a.token}});
    wa2.send({{"type", "subscribe"}, {"session", "s1"}});
    auto again = wa2.read_until(frame_type("reply"));
    BOOST_TEST(again.at("key").as_string() == key);
    // b's message to s1 is accepted into b's own s1.
    wb.send({{"type", "message"}, {"session", "s1"}, {"text", "b again"}, {"id", "c-9"}});
    auto ok = wb.read_until(frame_type("accepted"));
    BOOST_TEST(ok.at("session").as_string() == "s1");
}

BOOST_AUTO_TEST_CASE(quotas_answer_429_and_usage_survives_a_restart) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto a = new_token({"--tenant", "a"});
    auto b = new_token({"--tenant", "b"});
    auto ops = new_token({"--tenant", "ops", "--scope", "admin"});
    // a: two messages a minute, and one model token a day (the echo model reports a few a turn).
    auto cfg = f.write_file("baton.json", R"({"server": {"tokens": [)" + a.entry + "," + b.entry + "," +
                                              ops.entry + R"(]},
        "tenants": {"a": {"limits": {"turns_per_minute": 2, "tokens_per_day": 1}}}})");
    f.start({"--config", cfg.string()});
    auto post = [&](const issued& who, const std::string& text, const std::string& key = "") {
        auto headers = bearer(who.token);
        if (!key.empty()) headers.emplace_back("Idempotency-Key", key);
        return f.request("POST", "/v1/sessions/s1/messages",
                         json::serialize(json::object{{"text", text}}), headers);
    };
    auto first = post(a, "one", "key-1");
    BOOST_TEST_REQUIRE(first.status == 202u, first.body);
    f.wait_for_turn(std::string(first.json.at("turn_id").as_string()), bearer(a.token));
    // The day's budget is spent: quota_exceeded, until the next UTC midnight.
    auto spent = post(a, "two");
    BOOST_TEST(spent.status == 429u, spent.body);
    BOOST_TEST(spent.json.at("error").at("code").as_string() == "quota_exceeded");
    auto retry = std::stoll(spent.header("Retry-After").value_or("0"));
    BOOST_TEST((retry >= 1 && retry <= 86400), retry);
    // b is not held by a's limits.
    for (int i = 0; i < 5; ++i)
        BOOST_TEST(post(b, "b" + std::to_string(i)).status == 202u);
    // The usage a sees is its own.
    auto usage = f.request("GET", "/v1/usage", "", bearer(a.token));
    BOOST_TEST_REQUIRE(usage.status == 200u, usage.body);
    const auto& u = usage.json.as_object();
    BOOST_TEST(u.at("tenant").as_string() == "a");
    BOOST_TEST(u.at("today").at("turns").as_int64() == 1);
    auto tokens = u.at("today").at("tokens").as_int64();
    BOOST_TEST(tokens >= 1);
    BOOST_TEST(u.at("days").as_array().size() == 30u);
    BOOST_TEST(u.at("limits").at("tokens_per_day").as_int64() == 1);
    BOOST_TEST(u.at("limits").at("max_running_turns").is_null());
    BOOST_TEST(f.request("GET", "/v1/usage").status == 401u);
    auto m = f.request("GET", "/metrics", "", bearer(ops.token)).body;
    BOOST_TEST(m.find("baton_tenant_quota_exceeded_total{tenant=\"a\"} 1") != std::string::npos, m);
    BOOST_TEST(m.find("baton_tenant_tokens_today{tenant=\"a\"} " + std::to_string(tokens)) !=
                   std::string::npos,
               m);

    // After a restart the day's usage is still counted: still refused.
    f.stop();
    f.start({"--config", cfg.string()});
    spent = post(a, "three");
    BOOST_TEST(spent.status == 429u, spent.body);
    BOOST_TEST(spent.json.at("error").at("code").as_string() == "quota_exceeded");
    // A replay of the message accepted before the budget ran out finds its turn; the same key
    // with another body is still a reuse.
    auto replay = post(a, "one", "key-1");
    BOOST_TEST_REQUIRE(replay.status == 200u, replay.body);
    BOOST_TEST(replay.json.at("replayed").as_bool());
    BOOST_TEST(replay.json.at("turn_id") == first.json.at("turn_id"));
    BOOST_TEST(replay.json.at("status").as_string() == "completed");
    BOOST_TEST(post(a, "one!", "key-1").status == 409u);
    BOOST_TEST(post(a, "one", "key-2").status == 429u);
    usage = f.request("GET", "/v1/usage", "", bearer(a.token));
    BOOST_TEST(usage.json.at("today").at("tokens").as_int64() == tokens);
    // The WebSocket says the same, with retry_after.
    ws_client w(f.daemon->host(), f.daemon->port(), {{"Authorization", "Bearer " + a.token}});
    w.send({{"type", "message"}, {"session", "s1"}, {"text", "four"}, {"id", "c-1"}});
    auto err = w.read_until(frame_type("error"));
    BOOST_TEST(err.at("code").as_string() == "quota_exceeded");
    BOOST_TEST(err.at("retry_after").as_int64() >= 1);
}

// One tenant at its limit never holds another: while tenant a floods from eight connections at
// once (each with 25 pipelined messages, and refused past its rate), every message of tenant b is
// accepted and answered. (How b's latency holds meanwhile is a measurement: bench/isolation.sh,
// bench/RESULTS.md.)
BOOST_AUTO_TEST_CASE(a_flooding_tenant_is_refused_while_another_is_served) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto a = new_token({"--tenant", "a"});
    auto b = new_token({"--tenant", "b"});
    auto cfg = f.write_file("baton.json", R"({"server": {"tokens": [)" + a.entry + "," + b.entry + R"(]},
        "tenants": {"a": {"limits": {"turns_per_minute": 3, "max_running_turns": 1}}}})");
    f.start({"--config", cfg.string()});
    std::vector<connection> flood;
    for (int t = 0; t < 8; ++t) {
        flood.push_back(f.connect());
        std::string burst;
        for (int i = 0; i < 25; ++i)
            burst += format_request("POST", "/v1/sessions/a" + std::to_string(t) + "/messages",
                                    R"({"text":"flood"})", bearer(a.token));
        BOOST_TEST_REQUIRE(flood.back().write(burst), flood.back().last_error());
    }
    std::vector<std::string> b_turns;
    for (int i = 0; i < 20; ++i) {
        auto r =
            f.request("POST", "/v1/sessions/b" + std::to_string(i % 4) + "/messages",
                      json::serialize(json::object{{"text", "b" + std::to_string(i)}}), bearer(b.token));
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        b_turns.push_back(turn_id_of(r));
    }
    int a_accepted = 0, a_limited = 0, a_other = 0;
    for (auto& c : flood)
        for (int i = 0; i < 25; ++i) {
            auto r = c.read_response();
            BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
            if (r->status == 202u)
                ++a_accepted;
            else if (r->status == 429u && r->json.at("error").at("code").as_string() == "rate_limited")
                ++a_limited;
            else
                ++a_other;
        }
    for (std::size_t i = 0; i < b_turns.size(); ++i)
        BOOST_TEST(string_at(f.wait_for_turn(b_turns[i], bearer(b.token), {"completed"}), "reply") ==
                   "echo: b" + std::to_string(i));
    BOOST_TEST(a_accepted == 3); // the bucket's burst, then nothing within the minute
    BOOST_TEST(a_limited == 8 * 25 - 3);
    BOOST_TEST(a_other == 0);
}

BOOST_AUTO_TEST_CASE(the_rate_limit_answers_429_rate_limited) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto a = new_token({"--tenant", "a"});
    auto cfg = f.write_file("baton.json", R"({"server": {"tokens": [)" + a.entry + R"(]},
        "tenants": {"a": {"limits": {"turns_per_minute": 2}}}})");
    f.start({"--config", cfg.string()});
    std::vector<unsigned> statuses;
    http_response last;
    for (int i = 0; i < 4; ++i) {
        last = f.request("POST", "/v1/sessions/s" + std::to_string(i) + "/messages", R"({"text":"x"})",
                         bearer(a.token));
        statuses.push_back(last.status);
    }
    // A bucket of two refilled at one each 30 s: the first two pass, the next two wait ~30 s.
    BOOST_TEST(statuses == (std::vector<unsigned>{202, 202, 429, 429}),
               boost::test_tools::per_element());
    BOOST_TEST(last.json.at("error").at("code").as_string() == "rate_limited");
    auto retry = std::stoll(last.header("Retry-After").value_or("0"));
    BOOST_TEST((retry >= 1 && retry <= 60), retry);
    // Nothing refused was stored.
    BOOST_TEST(f.request("GET", "/v1/sessions/s2", "", bearer(a.token)).status == 404u);
}

BOOST_AUTO_TEST_CASE(tokens_allow_a_non_loopback_listen_and_check_config_warns) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto t = new_token({"--tenant", "a"});
    auto cfg = f.write_file("baton.json", R"({"server": {"tokens": [)" + t.entry + "]}}");
    // Without tokens this address is refused (docs/api.md); with them it is served.
    f.start({"--config", cfg.string(), "--listen", "0.0.0.0:0"});
    connection c("127.0.0.1", f.daemon->port());
    BOOST_TEST(c.request("GET", "/v1/sessions/x").status == 401u);
    f.stop();

    auto clear =
        f.write_file("clear.json", R"({"server": {"listen": "0.0.0.0:8080", "tokens": [{"token": ")" +
                                       t.token + R"(", "tenant": "a"}]}})");
    auto r = run_baton({"check-config", clear.string()});
    BOOST_TEST(r.exit_code == 0, r.output);
    BOOST_TEST(r.output.find("warning: server.tokens[0].token: a bearer token in clear text") !=
                   std::string::npos,
               r.output);
    BOOST_TEST(r.output.find("warning: server.listen: a non-loopback address") != std::string::npos,
               r.output);
    BOOST_TEST(r.output.find(t.token) == std::string::npos, r.output);
    // `baton token hash` gives the entry's digest.
    auto h = run_baton({"token", "hash"}, t.token + "\n");
    BOOST_TEST(h.exit_code == 0);
    BOOST_TEST(h.output == sha256_hex(t.token) + "\n");
    BOOST_TEST(run_baton({"token", "new"}).exit_code == 2);
    BOOST_TEST(run_baton({"token", "new", "--tenant", "a/b"}).exit_code == 2);
    BOOST_TEST(run_baton({"token", "new", "--tenant", "a", "--scope", "root"}).exit_code == 2);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(connection_limits)

BOOST_AUTO_TEST_CASE(one_connection_over_max_connections_gets_503_and_the_daemon_goes_on) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto cfg = f.write_file("baton.json", R"({"server": {"max_connections": 2}})");
    f.start({"--config", cfg.string()});
    // Two connections held open, one of them a WebSocket: both count.
    auto first = f.connect();
    BOOST_TEST(first.request("GET", "/healthz").status == 200u);
    ws_client ws(f.daemon->host(), f.daemon->port());
    auto third = f.connect();
    auto refused = third.request("GET", "/healthz");
    BOOST_TEST(refused.status == 503u);
    BOOST_TEST(refused.json.at("error").at("code").as_string() == "overloaded");
    BOOST_TEST(refused.header("Retry-After").value_or("") == "1");
    // The held ones are served as before.
    BOOST_TEST(first.request("GET", "/readyz").status == 200u);
    ws.send({{"type", "ping"}});
    BOOST_TEST(ws.read_until(frame_type("pong")).at("type").as_string() == "pong");
    // A place freed is taken again.
    ws.drop();
    bool served = false;
    for (int i = 0; i < 200 && !served; ++i) {
        auto again = f.connect();
        served = again.request("GET", "/healthz").status == 200u;
        if (!served) std::this_thread::sleep_for(10ms);
    }
    BOOST_TEST(served);
}

BOOST_AUTO_TEST_CASE(an_address_over_its_cap_gets_503_until_a_token_is_shown) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto a = new_token({"--tenant", "a"});
    auto cfg = f.write_file("baton.json",
                            R"({"server": {"max_connections_per_ip": 2, "tokens": [)" + a.entry + "]}}");
    f.start({"--config", cfg.string()});
    // One connection from 127.0.0.1 that says nothing at all; a WebSocket whose upgrade carries a
    // token, which stops counting once the upgrade is read; then one more without a token.
    auto silent = f.connect();
    ws_client ws(f.daemon->host(), f.daemon->port(), bearer(a.token));
    ws.send({{"type", "ping"}});
    BOOST_TEST(ws.read_until(frame_type("pong")).at("type").as_string() == "pong");
    auto anonymous = f.connect();
    BOOST_TEST(anonymous.request("GET", "/healthz").status == 200u);
    // Two without a token: the next one is refused before any request is read.
    auto third = f.connect();
    auto refused = third.request("GET", "/healthz");
    BOOST_TEST(refused.status == 503u);
    BOOST_TEST(refused.json.at("error").at("code").as_string() == "overloaded");
    BOOST_TEST(refused.json.at("error").at("message").as_string() ==
               "too many connections from this address");
    BOOST_TEST(refused.header("Retry-After").value_or("") == "1");
    // Headers every answer has (docs/api.md), this one too.
    BOOST_TEST(refused.header("Cache-Control").value_or("") == "no-store");
    BOOST_TEST(refused.header("Server").value_or("") == "baton");
    // A wrong token does not free a place; a valid one does, at once.
    BOOST_TEST(anonymous.request("GET", "/v1/usage", {}, bearer(a.token + "x")).status == 401u);
    BOOST_TEST(f.connect().request("GET", "/healthz").status == 503u);
    BOOST_TEST(anonymous.request("GET", "/v1/usage", {}, bearer(a.token)).status == 200u);
    auto next = f.connect();
    BOOST_TEST(next.request("GET", "/healthz").status == 200u);
    // Two without a token again (silent and next): the cap holds for the one after.
    BOOST_TEST(f.connect().request("GET", "/healthz").status == 503u);
    // The connections that showed a token are served as before, beside them.
    BOOST_TEST(anonymous.request("GET", "/v1/usage", {}, bearer(a.token)).status == 200u);
    ws.send({{"type", "ping"}});
    ws.read_until(frame_type("pong"));
}

BOOST_AUTO_TEST_CASE(without_tokens_a_loopback_daemon_has_no_per_address_cap) {
    daemon_fixture f;
    std::vector<connection> held;
    for (int i = 0; i < 40; ++i) {
        held.push_back(f.connect());
        BOOST_TEST_REQUIRE(held.back().request("GET", "/healthz").status == 200u, "connection " << i);
    }
}

// Clients that misbehave in every way the daemon bounds, all at once: a slowloris (headers one
// byte at a time, never finished), a slow POST (a body that stops), a keep-alive connection left
// idle, oversized headers, a WebSocket that sends an oversized frame, and one that never reads.
// None of them delays a well-behaved client, and each is answered or closed by its own limit.
BOOST_AUTO_TEST_CASE(misbehaving_clients_neither_stop_the_daemon_nor_delay_others) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto cfg =
        f.write_file("baton.json", R"({"server": {"header_timeout_ms": 3000, "body_timeout_ms": 3000,
        "idle_timeout_ms": 3000, "max_header_bytes": 4096},
        "channels": {"ws": {"max_frame_bytes": 4096, "idle_timeout_ms": 3000}}})");
    f.start({"--config", cfg.string()});
    auto t0 = std::chrono::steady_clock::now();
    auto slowloris = f.connect();
    BOOST_TEST_REQUIRE(slowloris.write("GET /healthz HTTP/1.1\r\nHost: 1"));
    auto slow_post = f.connect();
    BOOST_TEST_REQUIRE(
        slow_post.write("POST /v1/sessions/slow/messages HTTP/1.1\r\nHost: x\r\n"
                        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te"));
    auto idle = f.connect();
    BOOST_TEST(idle.request("GET", "/healthz").status == 200u);
    auto big_headers = f.connect();
    auto big = big_headers.request("GET", "/healthz", {}, {{"X-Big", std::string(8000, 'x')}});
    BOOST_TEST(big.status == 431u);
    ws_client oversized(f.daemon->host(), f.daemon->port());
    BOOST_TEST(oversized.try_send_text(std::string(10000, 'x')));
    BOOST_TEST(!oversized.read());
    BOOST_TEST(oversized.close_code() == 1009);
    auto deaf = f.connect();
    BOOST_TEST(deaf.request("GET", "/v1/ws", {}, upgrade_headers).status == 101u);
    BOOST_TEST(
        deaf.write(std::string("\x81\x80\0\0\0\0", 6))); // an empty masked text frame; never reads

    // Meanwhile a well-behaved client is served at once, turn and all, well before any of the
    // limits above (3 s) has fired.
    auto tid = turn_id_of(f.post_message("polite", "unaffected"));
    auto rec = f.wait_for_turn(tid, {"completed"});
    BOOST_TEST(string_at(rec, "reply") == "echo: unaffected");
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2500)),
               "served only after the misbehaving clients' timeouts");

    // Then each limit ends its connection: 408 for the unfinished request and body, a silent
    // close for the idle keep-alive connection.
    auto loris = slowloris.read_response();
    BOOST_TEST_REQUIRE(loris.has_value(), slowloris.last_error());
    check_error(*loris, 408, "request_timeout");
    auto post = slow_post.read_response();
    BOOST_TEST_REQUIRE(post.has_value(), slow_post.last_error());
    check_error(*post, 408, "request_timeout");
    auto idle_end = idle.read_until_close();
    BOOST_TEST(idle_end.closed);
    BOOST_TEST(idle_end.bytes.empty(), idle_end.bytes);
    BOOST_TEST(deaf.read_until_close().closed);
    // Nothing of the slow POST was stored, and the daemon is healthy.
    BOOST_TEST(f.request("GET", "/v1/sessions/slow").status == 404u);
    BOOST_TEST(f.request("GET", "/readyz").status == 200u);
}

BOOST_AUTO_TEST_SUITE_END()
