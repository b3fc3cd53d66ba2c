// TLS on the listener (docs/api.md "TLS"): a real daemon with a self-signed certificate made by
// the openssl command, reached as users reach it: curl --cacert for HTTP and SSE, `baton chat`
// over wss://, openssl s_client for the protocol floor. A plain-HTTP client, a client that trusts
// nothing and files that hold no certificate each get a clear refusal, and the daemon goes on.
#include "tests/daemon_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <sys/wait.h>
#include <thread>

using namespace baton::test;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

struct shell_result {
    int exit_code = -1;
    std::string output; // stdout (and stderr when the command redirects it)
};

// Runs a shell command, bounded by coreutils' timeout.
shell_result shell(const std::string& command, int seconds = 20) {
    shell_result r;
    std::string bounded = "timeout -s KILL " + std::to_string(seconds) + " " + command;
    FILE* p = ::popen(bounded.c_str(), "r");
    BOOST_TEST_REQUIRE(p != nullptr, "popen: " << command);
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        r.output.append(buf, n);
    int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

std::string quoted(const std::string& s) {
    std::string out = "'";
    for (char c : s)
        out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// A daemon with server.tls (a fresh self-signed certificate for 127.0.0.1 and localhost) and one
// token of tenant "a".
struct tls_fixture : daemon_fixture {
    fs::path cert, key;
    issued a;
    explicit tls_fixture(const std::string& extra_server = "") : daemon_fixture(deferred{}) {
        cert = dir.root / "cert.pem";
        key = dir.root / "key.pem";
        auto made = shell("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2"
                          " -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost"
                          " -keyout " +
                          quoted(key.string()) + " -out " + quoted(cert.string()) + " 2>&1");
        BOOST_TEST_REQUIRE(made.exit_code == 0, "openssl req: " << made.output);
        a = new_token({"--tenant", "a"});
        auto cfg = write_file("baton.json",
                              R"({"server": {)" + extra_server + R"("tls": {"cert_file": )" +
                                  json::serialize(json::value(cert.string())) + R"(, "key_file": )" +
                                  json::serialize(json::value(key.string())) + R"(}, "tokens": [)" +
                                  a.entry + "]}}");
        start({"--config", cfg.string()});
        BOOST_TEST_REQUIRE(daemon->tls(), "the daemon did not say listening on https://");
    }
    std::string url(const std::string& path) const {
        return "https://127.0.0.1:" + std::to_string(daemon->port()) + path;
    }
    // curl as a user runs it, trusting the daemon's certificate; the output ends with the status.
    shell_result curl(const std::string& args) const {
        return shell("curl -sS --cacert " + quoted(cert.string()) + " -w '\\n%{http_code}' " + args +
                     " 2>&1");
    }
    std::string bearer() const { return quoted("Authorization: Bearer " + a.token); }
};

struct one_connection_tls_fixture : tls_fixture {
    one_connection_tls_fixture() : tls_fixture(R"("max_connections": 1, )") {}
};

unsigned status_of(const shell_result& r) {
    auto nl = r.output.rfind('\n');
    return static_cast<unsigned>(std::atoi(r.output.c_str() + (nl == std::string::npos ? 0 : nl + 1)));
}
std::string body_of(const shell_result& r) {
    auto nl = r.output.rfind('\n');
    return nl == std::string::npos ? std::string() : r.output.substr(0, nl);
}

} // namespace

BOOST_AUTO_TEST_SUITE(tls)

BOOST_FIXTURE_TEST_CASE(curl_with_cacert_talks_to_the_daemon_over_https, tls_fixture) {
    auto health = curl(quoted(url("/healthz")));
    BOOST_TEST(health.exit_code == 0, health.output);
    BOOST_TEST(status_of(health) == 200u, health.output);
    // Tokens work as over plain HTTP.
    auto refused = curl(quoted(url("/v1/sessions/s1")));
    BOOST_TEST(status_of(refused) == 401u, refused.output);
    auto posted =
        curl("-H " + bearer() + " -H 'Content-Type: application/json' -d '{\"text\":\"over tls\"}' " +
             quoted(url("/v1/sessions/s1/messages")));
    BOOST_TEST_REQUIRE(status_of(posted) == 202u, posted.output);
    auto tid = std::string(json::parse(body_of(posted)).at("turn_id").as_string());
    // The event stream to its end, then the record.
    auto events = curl("-N -H " + bearer() + " " + quoted(url("/v1/turns/" + tid + "/events")));
    BOOST_TEST(status_of(events) == 200u, events.output);
    BOOST_TEST(events.output.find("event: turn.finished") != std::string::npos, events.output);
    auto turn = curl("-H " + bearer() + " " + quoted(url("/v1/turns/" + tid)));
    BOOST_TEST_REQUIRE(status_of(turn) == 200u, turn.output);
    auto rec = json::parse(body_of(turn)).as_object();
    BOOST_TEST(string_at(rec, "status") == "completed");
    BOOST_TEST(string_at(rec, "reply") == "echo: over tls");
    // Keep-alive over TLS: two requests on one connection.
    auto twice = shell("curl -sS --cacert " + quoted(cert.string()) +
                       " -o /dev/null -o /dev/null"
                       " -w '%{http_code}:%{num_connects} ' " +
                       quoted(url("/healthz")) + " " + quoted(url("/readyz")) + " 2>&1");
    BOOST_TEST(twice.output == "200:1 200:0 ", twice.output);
}

BOOST_FIXTURE_TEST_CASE(untrusted_plain_and_old_clients_are_refused_and_the_daemon_goes_on,
                        tls_fixture) {
    // curl without the certificate: it does not trust it (exit 60), nothing is served.
    auto untrusted = shell("curl -sS " + quoted(url("/healthz")) + " 2>&1");
    BOOST_TEST(untrusted.exit_code == 60, untrusted.output);
    // Plain HTTP to the TLS port: a plain 400 that says so, then the close.
    auto c = connect(5s);
    BOOST_TEST(c.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    auto plain = c.read_response();
    BOOST_TEST_REQUIRE(plain.has_value(), c.last_error());
    BOOST_TEST(check_error(*plain, 400, "invalid_request").find("https://") != std::string::npos);
    BOOST_TEST(c.read_until_close().closed, c.last_error());
    // TLS 1.1 is refused by the server (the client allows it: security level 0); 1.2 is taken.
    std::string s_client = "openssl s_client -connect 127.0.0.1:" + std::to_string(daemon->port()) +
                           " -CAfile " + quoted(cert.string()) + " -cipher 'DEFAULT:@SECLEVEL=0' ";
    auto old = shell(s_client + "-tls1_1 </dev/null 2>&1");
    BOOST_TEST(old.exit_code != 0, old.output);
    auto v12 = shell(s_client + "-tls1_2 </dev/null 2>&1");
    BOOST_TEST(v12.exit_code == 0, v12.output);
    BOOST_TEST(v12.output.find("Verify return code: 0 (ok)") != std::string::npos, v12.output);
    auto v13 = shell(s_client + "-tls1_3 </dev/null 2>&1");
    BOOST_TEST(v13.exit_code == 0, v13.output);
    // Still serving.
    BOOST_TEST(status_of(curl(quoted(url("/readyz")))) == 200u);
}

BOOST_FIXTURE_TEST_CASE(baton_chat_talks_over_wss, tls_fixture) {
    std::string wss = "wss://127.0.0.1:" + std::to_string(daemon->port());
    cli_process chat(
        {"chat", "--url", wss, "--cacert", cert.string(), "--token", a.token, "--session", "tls-chat"});
    BOOST_TEST_REQUIRE(chat.write("hello over wss\n"));
    BOOST_TEST(chat.wait_for("echo: hello over wss"), chat.output());
    BOOST_TEST(chat.wait() == 0, chat.output());
    // The same over https:// (mapped to wss://.../v1/ws).
    cli_process again({"chat", "--url", "https://127.0.0.1:" + std::to_string(daemon->port()),
                       "--cacert", cert.string(), "--token", a.token, "--session", "tls-chat"});
    BOOST_TEST_REQUIRE(again.write("and again\n"));
    BOOST_TEST(again.wait_for("echo: and again"), again.output());
    BOOST_TEST(again.wait() == 0, again.output());
    // Without the certificate: one clear message, exit 1, no retry loop.
    cli_process untrusted({"chat", "--url", wss, "--token", a.token, "--session", "tls-chat"});
    BOOST_TEST_REQUIRE(untrusted.write("never sent\n"));
    BOOST_TEST(untrusted.wait() == 1, untrusted.output());
    BOOST_TEST(untrusted.output().find("TLS: certificate verify failed") != std::string::npos,
               untrusted.output());
    BOOST_TEST(untrusted.output().find(a.token) == std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(over_max_connections_a_tls_client_gets_503_after_the_handshake,
                        one_connection_tls_fixture) {
    std::optional<connection> held(connect()); // a TCP connection that says nothing holds the place
    BOOST_TEST(held->write(std::string(1, '\x16')));
    auto refused = curl("-i " + quoted(url("/healthz")));
    BOOST_TEST(refused.exit_code == 0, refused.output);
    BOOST_TEST(status_of(refused) == 503u, refused.output);
    BOOST_TEST(refused.output.find("Retry-After: 1") != std::string::npos, refused.output);
    BOOST_TEST(refused.output.find("\"overloaded\"") != std::string::npos, refused.output);
    held.reset(); // its place is free again
    bool served = false;
    for (int i = 0; i < 50 && !served; ++i) {
        served = status_of(curl(quoted(url("/healthz")))) == 200u;
        if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    BOOST_TEST(served);
}

BOOST_AUTO_TEST_CASE(files_without_a_certificate_or_key_are_a_config_error) {
    daemon_fixture f(daemon_fixture::deferred{});
    auto junk = f.write_file("junk.pem", "not a certificate\n");
    auto missing = (f.dir.root / "missing.pem").string();
    auto missing_key = (f.dir.root / "missing.key").string();
    auto serve = [&](const std::string& cert, const std::string& key) {
        auto cfg = f.write_file(
            "bad.json", R"({"server": {"tls": {"cert_file": )" + json::serialize(json::value(cert)) +
                            R"(, "key_file": )" + json::serialize(json::value(key)) + "}}}");
        return run_baton({"serve", "--config", cfg.string(), "--listen", "127.0.0.1:0", "--data",
                          (f.dir.root / "data").string()});
    };
    // Both files wrong: one start names both, not the first only.
    auto no_file = serve(missing, missing_key);
    BOOST_TEST(no_file.exit_code == 2, no_file.output);
    BOOST_TEST(no_file.output.find("server.tls.cert_file") != std::string::npos, no_file.output);
    BOOST_TEST(no_file.output.find(missing) != std::string::npos, no_file.output);
    BOOST_TEST(no_file.output.find("server.tls.key_file") != std::string::npos, no_file.output);
    BOOST_TEST(no_file.output.find(missing_key) != std::string::npos, no_file.output);
    auto not_pem = serve(junk.string(), junk.string());
    BOOST_TEST(not_pem.exit_code == 2, not_pem.output);
    BOOST_TEST(not_pem.output.find("server.tls.cert_file") != std::string::npos, not_pem.output);
    // A certificate with another certificate's key.
    auto mk = [&](const std::string& name) {
        auto r =
            shell("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "
                  "/CN=x -keyout " +
                  quoted((f.dir.root / (name + ".key")).string()) + " -out " +
                  quoted((f.dir.root / (name + ".crt")).string()) + " 2>&1");
        BOOST_TEST_REQUIRE(r.exit_code == 0, r.output);
    };
    mk("one");
    mk("two");
    auto mismatch = serve((f.dir.root / "one.crt").string(), (f.dir.root / "two.key").string());
    BOOST_TEST(mismatch.exit_code == 2, mismatch.output);
    BOOST_TEST(mismatch.output.find("server.tls.key_file") != std::string::npos, mismatch.output);
    BOOST_TEST(mismatch.output.find("mismatch") != std::string::npos, mismatch.output);
    // Nothing was listening meanwhile.
    BOOST_TEST(mismatch.output.find("listening on") == std::string::npos, mismatch.output);
    // A key under a passphrase: refused at once, no passphrase asked for (the daemon would wait
    // on a terminal for ever).
    const auto enc = (f.dir.root / "enc.key").string();
    auto encrypted_key = shell("openssl ec -in " + quoted((f.dir.root / "one.key").string()) +
                               " -aes256 -passout pass:pw -out " + quoted(enc) + " 2>&1");
    BOOST_TEST_REQUIRE(encrypted_key.exit_code == 0, encrypted_key.output);
    auto locked = serve((f.dir.root / "one.crt").string(), enc);
    BOOST_TEST(locked.exit_code == 2, locked.output);
    BOOST_TEST(locked.output.find("server.tls.key_file: " + enc + " is encrypted") != std::string::npos,
               locked.output);
    BOOST_TEST(locked.output.find("pass phrase") == std::string::npos, locked.output);
    // check-config reads the files as serve does.
    auto check = [&](const std::string& cert, const std::string& key) {
        auto cfg = f.write_file(
            "check.json", R"({"server": {"tls": {"cert_file": )" + json::serialize(json::value(cert)) +
                              R"(, "key_file": )" + json::serialize(json::value(key)) + "}}}");
        return run_baton({"check-config", cfg.string()});
    };
    auto checked_missing = check(missing, missing_key);
    BOOST_TEST(checked_missing.exit_code == 2, checked_missing.output);
    BOOST_TEST(checked_missing.output.find("server.tls.cert_file") != std::string::npos,
               checked_missing.output);
    BOOST_TEST(checked_missing.output.find("server.tls.key_file") != std::string::npos,
               checked_missing.output);
    BOOST_TEST(check((f.dir.root / "one.crt").string(), enc).exit_code == 2);
    auto good = check((f.dir.root / "one.crt").string(), (f.dir.root / "one.key").string());
    BOOST_TEST(good.exit_code == 0, good.output);
    BOOST_TEST(good.output.find(": ok") != std::string::npos, good.output);
}

BOOST_AUTO_TEST_SUITE_END()
