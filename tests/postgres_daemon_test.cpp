// `baton serve` on PostgreSQL (the test cluster of scripts/pg-cluster, a schema of its own per
// case), through its socket like a user: messages complete and survive a restart, a second node
// on the same database is refused, and the database stopped and started again under load costs
// no accepted message (refusals meanwhile are 503 store_unavailable). Skipped without a cluster.
#include "tests/daemon_fixture.hpp"
#include "tests/pg_test.hpp"
#include "tests/plain_http.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdlib>
#include <map>
#include <thread>

using namespace baton::test;

namespace {

struct pg_daemon {
    scratch_dir dir;
    pg_schema schema;
    std::filesystem::path config;
    std::unique_ptr<daemon_process> daemon;

    pg_daemon() {
        config = dir.root / "baton.json";
        json::object cfg{
            {"storage", {{"postgres", {{"conninfo", schema.conninfo()}, {"pool_size", 2}}}}}};
        write_text_file(config, json::serialize(cfg));
    }
    void start() {
        daemon = std::make_unique<daemon_process>(
            std::vector<std::string>{"serve", "--listen", "127.0.0.1:0", "--config", config.string()},
            dir.root / "daemon.log", 20s);
    }
    http_response request(std::string_view method, std::string_view target, std::string_view body = {},
                          const header_list& headers = {}) const {
        return connection(daemon->host(), daemon->port(), 20s).request(method, target, body, headers);
    }
};

std::string text_body(const std::string& text) {
    return json::serialize(json::object{{"text", text}});
}

// Runs scripts/pg-cluster COMMAND on the test cluster; fails the test when it fails.
void cluster(const std::string& command) {
    auto cmd =
        std::string(BATON_SOURCE_DIR) + "/scripts/pg-cluster " + command + " '" + test_pg_dir() + "'";
    BOOST_TEST_REQUIRE(std::system(cmd.c_str()) == 0, cmd);
}

bool have_cluster() {
    if (!test_pg().empty()) return true;
    BOOST_TEST_MESSAGE("BATON_TEST_PG is not set: the PostgreSQL daemon cases are skipped");
    return false;
}

} // namespace

BOOST_AUTO_TEST_SUITE(postgres_daemon)

BOOST_AUTO_TEST_CASE(messages_complete_in_order_and_survive_a_restart) {
    if (!have_cluster()) return;
    pg_daemon d;
    d.start();
    std::vector<std::pair<std::string, std::string>> turns; // session, turn id
    for (int i = 0; i < 24; ++i) {
        auto sid = "s" + std::to_string(i % 4);
        auto r = d.request("POST", "/v1/sessions/" + sid + "/messages?wait=20",
                           text_body("m" + std::to_string(i)));
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        BOOST_TEST(string_at(body_object(r), "status") == "completed", r.body);
        turns.emplace_back(sid, turn_id_of(r));
    }
    BOOST_TEST(d.daemon->stop() == 0);
    d.start();
    for (const auto& [sid, tid] : turns) {
        auto r = d.request("GET", "/v1/turns/" + tid);
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        BOOST_TEST(string_at(body_object(r), "status") == "completed");
        BOOST_TEST(string_at(body_object(r), "session_id") == sid);
    }
    auto s = d.request("GET", "/v1/sessions/s1");
    BOOST_TEST_REQUIRE(s.status == 200u, s.body);
    BOOST_TEST(int_at(body_object(s), "turns") == 6);
    // The tape keeps the session's messages in accept order.
    auto tape = d.request("GET", "/v1/sessions/s1/tape?limit=100");
    BOOST_TEST_REQUIRE(tape.status == 200u, tape.body);
    std::vector<std::string> users;
    for (const auto& e : body_object(tape).at("entries").as_array()) {
        const auto& p = e.at("payload").as_object();
        if (string_at(p, "role") == "user") users.push_back(string_at(p, "text"));
    }
    BOOST_TEST((users == std::vector<std::string>{"m1", "m5", "m9", "m13", "m17", "m21"}), tape.body);
    auto idem = header_list{{"Idempotency-Key", "k-1"}};
    auto first = d.request("POST", "/v1/sessions/s9/messages", text_body("once"), idem);
    auto again = d.request("POST", "/v1/sessions/s9/messages", text_body("once"), idem);
    BOOST_TEST(first.status == 202u, first.body);
    BOOST_TEST(turn_id_of(first) == turn_id_of(again));
    BOOST_TEST(d.request("GET", "/readyz").status == 200u);
}

BOOST_AUTO_TEST_CASE(a_second_node_on_the_same_database_is_refused) {
    if (!have_cluster()) return;
    pg_daemon d;
    d.start();
    auto second = run_baton({"serve", "--listen", "127.0.0.1:0", "--config", d.config.string()}, 20s);
    BOOST_TEST(second.exit_code == 1, second.output);
    BOOST_TEST(second.output.find("another baton node is using this database") != std::string::npos,
               second.output);
    BOOST_TEST(d.request("GET", "/readyz").status == 200u);

    // Found by a new user: a node with "cluster" and one without started beside each other on one
    // database, and both ran the same turns. Neither starts beside the other now.
    auto cluster_config = d.dir.root / "cluster.json";
    json::object cfg{
        {"storage",
         {{"postgres", {{"conninfo", d.schema.conninfo()}, {"pool_size", 2}, {"cluster", true}}}}}};
    write_text_file(cluster_config, json::serialize(cfg));
    auto clustered =
        run_baton({"serve", "--listen", "127.0.0.1:0", "--config", cluster_config.string()}, 20s);
    BOOST_TEST(clustered.exit_code == 1, clustered.output);
    BOOST_TEST(clustered.output.find("without \"cluster\": true is using this database alone") !=
                   std::string::npos,
               clustered.output);
    BOOST_TEST(d.request("GET", "/readyz").status == 200u);
    d.daemon->stop();
    daemon_process node({"serve", "--listen", "127.0.0.1:0", "--config", cluster_config.string()},
                        d.dir.root / "node.log", 20s);
    auto alone = run_baton({"serve", "--listen", "127.0.0.1:0", "--config", d.config.string()}, 20s);
    BOOST_TEST(alone.exit_code == 1, alone.output);
    BOOST_TEST(alone.output.find("another baton node is using this database") != std::string::npos,
               alone.output);
    // Cluster nodes start beside each other as before.
    daemon_process other({"serve", "--listen", "127.0.0.1:0", "--config", cluster_config.string()},
                         d.dir.root / "other.log", 20s);
    BOOST_TEST(connection(other.host(), other.port(), 20s).request("GET", "/readyz").status == 200u);
}

BOOST_AUTO_TEST_CASE(a_password_in_the_conninfo_is_a_config_error) {
    scratch_dir dir;
    auto path = dir.root / "baton.json";
    write_text_file(path,
                    R"({"storage": {"postgres": {"conninfo": "host=127.0.0.1 password=secret"}}})");
    auto r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code == 2, r.output);
    BOOST_TEST(r.output.find("storage.postgres.conninfo") != std::string::npos, r.output);
    write_text_file(path,
                    R"({"storage": {"postgres": {"conninfo": "postgresql://baton:secret@db/baton"}}})");
    r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code == 2, r.output);
    write_text_file(
        path,
        R"({"storage": {"postgres": {"conninfo_env": "BATON_TEST_NO_SUCH_VAR", "pool_size": 2}}})");
    r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code == 0, r.output);
    r = run_baton({"serve", "--listen", "127.0.0.1:0", "--config", path.string()});
    BOOST_TEST(r.exit_code == 1, r.output);
    BOOST_TEST(r.output.find("BATON_TEST_NO_SUCH_VAR") != std::string::npos, r.output);
    // Found by a new user: check-config said ok for a conninfo libpq refuses (serve then exited 1).
    for (std::string conninfo : {"host=127.0.0.1 bogus=1", "postgresql://[::1"}) {
        json::object cfg{{"storage", {{"postgres", {{"conninfo", conninfo}}}}}};
        write_text_file(path, json::serialize(cfg));
        r = run_baton({"check-config", path.string()});
        BOOST_TEST(r.exit_code == 2, conninfo << ": " << r.output);
        BOOST_TEST(r.output.find("storage.postgres.conninfo: ") != std::string::npos, r.output);
        if (conninfo.find("bogus") != std::string::npos)
            BOOST_TEST(r.output.find("\"bogus\"") != std::string::npos, r.output); // libpq's words
    }
}

BOOST_AUTO_TEST_CASE(the_database_restarted_under_load_loses_nothing_accepted) {
    if (!have_cluster() || test_pg_dir().empty()) return;
    pg_daemon d;
    d.start();
    // Two clients send without pause, each message with a key of its own, until told to stop; a
    // refusal must be 503 store_unavailable (or 429 session_queue_full), and is sent again (same
    // key) until accepted.
    std::atomic<bool> stop{false};
    std::atomic<int> refused{0};
    std::mutex m;
    std::map<std::string, std::string> accepted; // key -> turn id
    std::vector<std::string> bad;
    auto client = [&](int c) {
        for (int i = 0; !stop.load() || i % 10 != 0; ++i) {
            auto key = "c" + std::to_string(c) + "-" + std::to_string(i);
            for (int attempt = 0; attempt < 200; ++attempt) {
                // No Boost.Test here (not thread-safe): plain_request, and the checks after join.
                std::string error;
                auto r = plain_request(d.daemon->host(), d.daemon->port(), "POST",
                                       "/v1/sessions/load" + std::to_string(c) + "/messages",
                                       text_body(key), {{"Idempotency-Key", key}}, 20s, error);
                if (!r) {
                    std::lock_guard lock(m);
                    bad.push_back("no response: " + error);
                    return;
                }
                if (r->status == 202u) {
                    std::lock_guard lock(m);
                    accepted[key] = json_field(r->body, "turn_id");
                    break;
                }
                // A session whose turns wait on the database fills its queue: 429, retried too.
                if (r->status == 429u && error_code_of(r->body) == "session_queue_full") {
                    std::this_thread::sleep_for(100ms);
                    continue;
                }
                if (r->status != 503u || error_code_of(r->body) != "store_unavailable") {
                    std::lock_guard lock(m);
                    bad.push_back(std::to_string(r->status) + " " + r->body);
                    return;
                }
                refused.fetch_add(1);
                std::this_thread::sleep_for(100ms);
            }
        }
    };
    std::thread a(client, 0), b(client, 1);
    std::this_thread::sleep_for(500ms);
    cluster("pause");
    // Readiness follows the database (the probe runs every second).
    bool not_ready = false;
    for (int i = 0; i < 100 && !not_ready; ++i) {
        auto r = d.request("GET", "/readyz");
        not_ready = r.status == 503u && !check_error(r, 503, "store_unavailable").empty();
        if (!not_ready) std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST(not_ready);
    cluster("resume");
    bool ready = false;
    for (int i = 0; i < 200 && !ready; ++i) {
        ready = d.request("GET", "/readyz").status == 200u;
        if (!ready) std::this_thread::sleep_for(100ms);
    }
    BOOST_TEST(ready);
    std::this_thread::sleep_for(500ms);
    stop = true;
    a.join();
    b.join();
    BOOST_TEST(bad.empty(), (bad.empty() ? "" : bad.front()));
    BOOST_TEST(refused.load() > 0);
    BOOST_TEST_MESSAGE("accepted " << accepted.size() << ", refused meanwhile " << refused.load());
    // Every accepted message reaches a terminal turn: completed, or (a turn whose own write was
    // cut off with the database, see docs/design.md "PostgreSQL") failed, saying so.
    int failed = 0;
    for (const auto& [key, tid] : accepted) {
        auto r = d.request("GET", "/v1/turns/" + tid + "?wait=30");
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        auto status = string_at(body_object(r), "status");
        if (status == "failed" && r.body.find("postgres") != std::string::npos) {
            ++failed;
            continue;
        }
        BOOST_TEST(status == "completed", key << ": " << r.body);
    }
    BOOST_TEST_MESSAGE("failed with the database: " << failed);
    BOOST_TEST(failed <= 10);
    // And once each: the sessions count exactly the accepted keys.
    std::size_t counted = 0;
    for (int c = 0; c < 2; ++c) {
        auto s = d.request("GET", "/v1/sessions/load" + std::to_string(c));
        BOOST_TEST_REQUIRE(s.status == 200u, s.body);
        counted += static_cast<std::size_t>(int_at(body_object(s), "turns"));
    }
    BOOST_TEST(counted == accepted.size());
}

BOOST_AUTO_TEST_SUITE_END()
