// End-to-end tests of the `baton` process itself: accepted turns survive a graceful restart and a
// crash on the same data directory, and the command line answers with the documented exit codes.
#include "tests/daemon_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

using namespace baton::test;

namespace {

struct posted_turn {
    std::string turn_id;
    std::string session_id;
    std::string text;
};

// Twenty messages over four sessions, without waiting for any of them.
std::vector<posted_turn> post_twenty(const daemon_fixture& f) {
    std::vector<posted_turn> out;
    for (int i = 0; i < 20; ++i) {
        std::string sid = "dur-" + std::to_string(i % 4);
        std::string text = "message " + std::to_string(i);
        auto r = f.post_message(sid, text);
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        out.push_back({turn_id_of(r), sid, text});
    }
    return out;
}

std::int64_t session_turns(const daemon_fixture& f, const std::string& sid) {
    return int_at(body_object(f.request("GET", "/v1/sessions/" + sid)), "turns");
}

} // namespace

BOOST_AUTO_TEST_SUITE(http_daemon)

BOOST_FIXTURE_TEST_CASE(accepted_turns_survive_a_graceful_restart, daemon_fixture) {
    auto posted = post_twenty(*this);
    pid_t first_pid = daemon->pid();
    BOOST_TEST(stop() == 0, "exit code after SIGTERM");
    start();
    BOOST_TEST(daemon->pid() != first_pid);
    // A drained daemon loses nothing: turns it did not start run after the restart.
    for (const auto& p : posted)
        BOOST_TEST_CONTEXT(p.turn_id << " (" << p.text << ")") {
            auto rec = wait_for_turn(p.turn_id);
            BOOST_TEST(string_at(rec, "status") == "completed");
            BOOST_TEST(string_at(rec, "session_id") == p.session_id);
            BOOST_TEST(string_at(rec, "reply") == "echo: " + p.text);
        }
    for (int s = 0; s < 4; ++s)
        BOOST_TEST(session_turns(*this, "dur-" + std::to_string(s)) == 5);
}

BOOST_FIXTURE_TEST_CASE(accepted_turns_survive_a_crash, daemon_fixture) {
    auto posted = post_twenty(*this);
    crash();
    start();
    // A 202 means stored: every turn is still there and ends, whether it was cut short or not.
    for (const auto& p : posted)
        BOOST_TEST_CONTEXT(p.turn_id << " (" << p.text << ")") {
            auto rec = wait_for_turn(p.turn_id);
            BOOST_TEST(string_at(rec, "session_id") == p.session_id);
            if (string_at(rec, "status") == "completed")
                BOOST_TEST(string_at(rec, "reply") == "echo: " + p.text);
        }
    for (int s = 0; s < 4; ++s)
        BOOST_TEST(session_turns(*this, "dur-" + std::to_string(s)) == 5);
    auto r = post_message("dur-0", "after the crash");
    BOOST_TEST_REQUIRE(r.status == 202u, r.body);
    BOOST_TEST(string_at(wait_for_turn(turn_id_of(r)), "reply") == "echo: after the crash");
}

BOOST_AUTO_TEST_CASE(check_config_accepts_a_valid_file) {
    scratch_dir dir;
    auto path = dir.root / "good.json";
    write_text_file(path, R"({"server": {"listen": "127.0.0.1:0", "header_timeout_ms": 300},
                              "storage": {"sqlite": {"path": ")" +
                              (dir.root / "baton.db").string() + R"("}}})");
    auto r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code == 0, r.output);
}

BOOST_AUTO_TEST_CASE(check_config_rejects_with_the_json_path) {
    scratch_dir dir;
    auto path = dir.root / "bad.json";
    write_text_file(path, R"({"agents":{"default":{"limits":{"max_steps":"x"}}}})");
    auto r = run_baton({"check-config", path.string()});
    BOOST_TEST(r.exit_code == 2, r.output);
    BOOST_TEST(r.output.find("agents.default.limits.max_steps") != std::string::npos, r.output);

    auto missing = run_baton({"check-config", (dir.root / "missing.json").string()});
    BOOST_TEST(missing.exit_code == 2, missing.output);
}

BOOST_AUTO_TEST_CASE(serve_refuses_an_invalid_config) {
    scratch_dir dir;
    auto path = dir.root / "bad.json";
    write_text_file(path, R"({"agents":{"default":{"limits":{"max_steps":"x"}}}})");
    auto r = run_baton({"serve", "--config", path.string(), "--listen", "127.0.0.1:0", "--data",
                        (dir.root / "data").string()});
    BOOST_TEST(r.exit_code == 2, r.output);
    BOOST_TEST(r.output.find("agents.default.limits.max_steps") != std::string::npos, r.output);
    BOOST_TEST(r.output.find("listening on") == std::string::npos, r.output);
}

BOOST_AUTO_TEST_CASE(version_exits_0) {
    auto r = run_baton({"--version"});
    BOOST_TEST(r.exit_code == 0, r.output);
    BOOST_TEST(r.output.starts_with("baton "), r.output);
}

BOOST_AUTO_TEST_SUITE_END()
