// End-to-end tests of the `baton` process as a peer and as a program. Suite http_api (with
// http_api_test.cpp): keep-alive, pipelining, the body limit under both framings, header and idle
// timeouts, malformed requests, and that none of it costs the daemon its health or its turns.
// Suite http_daemon: accepted turns survive a graceful restart and a crash on the same data
// directory, and the command line answers with the documented exit codes.
#include "tests/daemon_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace baton::test;
using steady = std::chrono::steady_clock;

namespace {

constexpr std::size_t max_body_bytes = 1048576; // the default of server.max_body_bytes

std::string chunk(std::string_view data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + std::string(data) + "\r\n";
}

const std::string chunked_head = "POST /v1/sessions/big/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

long long ms_since(steady::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0).count();
}

std::vector<std::string> user_texts(const daemon_fixture& f, const std::string& sid) {
    auto tape = f.request("GET", "/v1/sessions/" + sid + "/tape");
    std::vector<std::string> out;
    for (const auto& e : body_object(tape).at("entries").as_array()) {
        const auto& p = e.at("payload").as_object();
        if (string_at(e.as_object(), "kind") == "message" && string_at(p, "role") == "user")
            out.push_back(string_at(p, "text"));
    }
    return out;
}

// A daemon whose config file shortens the header and idle timeouts.
struct short_timeouts_fixture : daemon_fixture {
    short_timeouts_fixture() : daemon_fixture(deferred{}) {
        json::object storage;
        storage["sqlite"] = json::object{{"path", (data_dir() / "baton.db").string()}};
        json::object cfg;
        cfg["server"] = json::object{{"header_timeout_ms", 300}, {"idle_timeout_ms", 500}};
        cfg["storage"] = std::move(storage);
        auto path = write_file("baton.json", json::serialize(cfg));
        start({"--config", path.string()});
    }
};

// A daemon whose echo agent has room for messages of a megabyte in its context.
struct wide_context_fixture : daemon_fixture {
    wide_context_fixture() : daemon_fixture(deferred{}) {
        json::object storage;
        storage["sqlite"] = json::object{{"path", (data_dir() / "baton.db").string()}};
        json::object cfg;
        cfg["storage"] = std::move(storage);
        cfg["agents"] = json::object{
            {"default", json::object{{"model", json::object{{"provider", "echo"},
                                                            {"context_window", 100000000}}}}}};
        auto path = write_file("baton.json", json::serialize(cfg));
        start({"--config", path.string()});
    }
};

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

BOOST_AUTO_TEST_SUITE(http_api)

BOOST_FIXTURE_TEST_CASE(keep_alive_serves_twenty_requests_on_one_connection, daemon_fixture) {
    auto c = connect();
    std::string last_tid;
    for (int i = 0; i < 20; ++i)
        BOOST_TEST_CONTEXT("request " << i) {
            if (i % 2 == 0) {
                auto r = c.request("GET", "/healthz");
                BOOST_TEST(r.status == 200u);
                BOOST_TEST(r.keep_alive);
            } else {
                auto r = c.request("POST", "/v1/sessions/ka/messages",
                                   R"({"text": "k)" + std::to_string(i) + R"("})");
                BOOST_TEST(r.status == 202u, r.body);
                BOOST_TEST(r.keep_alive);
                last_tid = turn_id_of(r);
            }
        }
    wait_for_turn(last_tid, {"completed"});
    BOOST_TEST(int_at(body_object(c.request("GET", "/v1/sessions/ka")), "turns") == 10);
}

BOOST_FIXTURE_TEST_CASE(pipelined_requests_are_answered_in_order, daemon_fixture) {
    const std::string target = "/v1/sessions/pipe/messages";
    std::string batch = format_request("GET", "/healthz") +
                        format_request("POST", target, R"({"text": "p1"})") +
                        format_request("GET", "/v1/turns/t_0000000000000000000000000a") +
                        format_request("POST", target, R"({"text": "p2"})") +
                        format_request("GET", "/v1/sessions/none-such");
    auto c = connect();
    BOOST_TEST_REQUIRE(c.write(batch), c.last_error());
    std::vector<http_response> answers;
    for (int i = 0; i < 5; ++i) {
        auto r = c.read_response();
        BOOST_TEST_REQUIRE(r.has_value(), "response " << i << ": " << c.last_error());
        answers.push_back(std::move(*r));
    }
    std::vector<unsigned> statuses;
    for (const auto& r : answers)
        statuses.push_back(r.status);
    BOOST_TEST((statuses == std::vector<unsigned>{200, 202, 404, 202, 404}));
    check_error(answers[2], 404, "not_found");
    check_error(answers[4], 404, "not_found");
    wait_for_turn(turn_id_of(answers[1]), {"completed"});
    wait_for_turn(turn_id_of(answers[3]), {"completed"});
    BOOST_TEST((user_texts(*this, "pipe") == std::vector<std::string>{"p1", "p2"}));
}

BOOST_FIXTURE_TEST_CASE(http_1_0_requests_get_http_1_0_replies, daemon_fixture) {
    // Without keep-alive: the reply, then the close.
    auto once = connect();
    BOOST_TEST_REQUIRE(once.write("GET /healthz HTTP/1.0\r\n\r\n"), once.last_error());
    auto all = once.read_until_close();
    BOOST_TEST(all.closed, once.last_error());
    BOOST_TEST(all.bytes.starts_with("HTTP/1.0 200 OK\r\n"), all.bytes);
    BOOST_TEST(all.bytes.find("\r\nContent-Length: 15\r\n") != std::string::npos, all.bytes);
    BOOST_TEST(all.bytes.find("Connection:") == std::string::npos, all.bytes);
    BOOST_TEST(all.bytes.ends_with("\r\n\r\n{\"status\":\"ok\"}"), all.bytes);

    // With it: the reply says so and the connection serves the next request.
    auto kept = connect();
    for (int i = 0; i < 2; ++i) {
        BOOST_TEST_REQUIRE(kept.write("GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
                           kept.last_error());
        auto r = kept.read_response();
        BOOST_TEST_REQUIRE(r.has_value(), "request " << i << ": " << kept.last_error());
        BOOST_TEST(r->status == 200u);
        BOOST_TEST(r->keep_alive);
        BOOST_TEST(r->header("Connection").value_or("") == "keep-alive");
    }
}

BOOST_FIXTURE_TEST_CASE(a_request_sent_in_pieces_is_read_whole, daemon_fixture) {
    const std::string body = R"({"text": "in pieces"})";
    const std::string head = "POST /v1/sessions/pieces/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Content-Type: application/json\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\n\r\n";
    auto c = connect();
    // Cut inside the request line, inside a header, between header and body, inside the body.
    const std::vector<std::string> pieces{head.substr(0, 7), head.substr(7, 40), head.substr(47),
                                          body.substr(0, 5), body.substr(5)};
    for (const auto& p : pieces) {
        BOOST_TEST_REQUIRE(c.write(p), c.last_error());
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    auto r = c.read_response();
    BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
    BOOST_TEST(r->status == 202u, r->body);
    BOOST_TEST(string_at(wait_for_turn(turn_id_of(*r)), "reply") == "echo: in pieces");
    // The connection is still good for the next request.
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
}

BOOST_FIXTURE_TEST_CASE(a_reply_larger_than_the_socket_buffers_reaches_a_slow_reader,
                        wide_context_fixture) {
    // 12 messages of 900 KB (and their echoes, cut to max_reply_bytes): a tape page of ~11 MB, more
    // than the kernel holds for a reader that does not read yet, so the daemon has to wait for the
    // socket to drain.
    const std::string text(900 * 1024, 'x');
    std::string last;
    for (int i = 0; i < 12; ++i) {
        auto r = post_message("slow-reader", text);
        BOOST_TEST_REQUIRE(r.status == 202u, r.body);
        last = turn_id_of(r);
    }
    wait_for_turn(last, {"completed"});
    auto c = connect();
    BOOST_TEST_REQUIRE(c.write(format_request("GET", "/v1/sessions/slow-reader/tape?limit=1000")),
                       c.last_error());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto r = c.read_response();
    BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
    BOOST_TEST(r->status == 200u);
    BOOST_TEST(r->header("Content-Length").value_or("") == std::to_string(r->body.size()));
    BOOST_TEST_REQUIRE(r->json.is_object(), "the tape page is not JSON");
    const auto& entries = r->json.at("entries").as_array();
    BOOST_TEST(entries.size() == 24u);
    int whole = 0;
    for (const auto& e : entries) {
        const auto& p = e.at("payload").as_object();
        whole += string_at(p, "role") == "user" && string_at(p, "text") == text;
    }
    BOOST_TEST(whole == 12);
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
}

BOOST_FIXTURE_TEST_CASE(body_over_the_limit_with_content_length_is_413, daemon_fixture) {
    // The client waits for an answer before sending the body, as with Expect: 100-continue.
    auto c = connect();
    const header_list too_long{{"Content-Length", std::to_string(max_body_bytes + 1)}};
    BOOST_TEST_REQUIRE(c.write(format_request("POST", "/v1/sessions/big/messages", {}, too_long)));
    auto r = c.read_response();
    BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
    check_error(*r, 413, "payload_too_large");
    BOOST_TEST(c.read_until_close().closed);

    // Exactly the limit is fine.
    std::string body = R"({"text": ")";
    body.append(max_body_bytes - body.size() - 2, 'a').append("\"}");
    BOOST_TEST_REQUIRE(body.size() == max_body_bytes);
    auto ok = request("POST", "/v1/sessions/big/messages", body);
    BOOST_TEST(ok.status == 202u, ok.body);
}

BOOST_FIXTURE_TEST_CASE(chunked_body_over_the_limit_is_413, daemon_fixture) {
    auto small = connect();
    BOOST_TEST_REQUIRE(
        small.write(chunked_head + chunk(R"({"text": )") + chunk(R"("chunked"})") + "0\r\n\r\n"));
    auto accepted = small.read_response();
    BOOST_TEST_REQUIRE(accepted.has_value(), small.last_error());
    BOOST_TEST(accepted->status == 202u, accepted->body);
    BOOST_TEST(string_at(wait_for_turn(turn_id_of(*accepted)), "reply") == "echo: chunked");

    // Sixteen chunks reach the limit exactly; the next chunk's header alone crosses it, so the
    // daemon has read every byte sent when it answers.
    auto c = connect();
    BOOST_TEST_REQUIRE(c.write(chunked_head), c.last_error());
    const std::string piece = chunk(std::string(max_body_bytes / 16, 'a'));
    for (int i = 0; i < 16; ++i)
        BOOST_TEST_REQUIRE(c.write(piece), "chunk " << i << ": " << c.last_error());
    BOOST_TEST_REQUIRE(c.write("1\r\n"), c.last_error());
    auto r = c.read_response();
    BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
    check_error(*r, 413, "payload_too_large");
    BOOST_TEST(c.read_until_close().closed);
}

BOOST_FIXTURE_TEST_CASE(partial_header_times_out_with_408, short_timeouts_fixture) {
    auto c = connect();
    auto t0 = steady::now();
    BOOST_TEST_REQUIRE(c.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
    auto r = c.read_response();
    long long waited = ms_since(t0);
    BOOST_TEST(r.has_value(), "no 408 answer before the close: " << c.last_error());
    if (r) check_error(*r, 408, "request_timeout");
    BOOST_TEST(waited >= 250);
    BOOST_TEST(waited < 5000);
    auto rest = c.read_until_close();
    BOOST_TEST(rest.closed, c.last_error());
    BOOST_TEST(rest.bytes.empty());
    BOOST_TEST(ms_since(t0) < 5000);
}

BOOST_FIXTURE_TEST_CASE(idle_connection_is_closed_without_an_answer, short_timeouts_fixture) {
    auto c = connect();
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
    auto t0 = steady::now();
    auto rest = c.read_until_close();
    BOOST_TEST(rest.closed, c.last_error());
    BOOST_TEST(rest.bytes.empty(), rest.bytes);
    BOOST_TEST(ms_since(t0) >= 400);
    BOOST_TEST(ms_since(t0) < 5000);
}

BOOST_FIXTURE_TEST_CASE(malformed_request_is_400_then_closed, daemon_fixture) {
    const std::vector<std::string> requests{
        "this is not http\r\n\r\n",
        "GET /healthz\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nno colon in this header\r\n\r\n",
        "POST /v1/sessions/s1/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    };
    for (std::size_t i = 0; i < requests.size(); ++i)
        BOOST_TEST_CONTEXT("request " << i) {
            auto c = connect();
            BOOST_TEST_REQUIRE(c.write(requests[i]), c.last_error());
            auto r = c.read_response();
            BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
            check_error(*r, 400, "invalid_request");
            BOOST_TEST(c.read_until_close().closed, c.last_error());
        }
}

// A framing other than Content-Length or chunked alone could be read otherwise by a proxy in
// front: refused before the body, and the connection closed, so that no byte of it is read as a
// request of its own (request smuggling). Two Authorization headers are refused too.
BOOST_FIXTURE_TEST_CASE(a_body_framed_otherwise_than_chunked_is_refused_and_closes, daemon_fixture) {
    const std::string smuggled = "GET /v1/sessions/sm HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (std::string te : {"gzip", "chunked, gzip", "gzip, chunked", "xchunked"}) {
        BOOST_TEST_CONTEXT(te) {
            auto c = connect();
            BOOST_TEST_REQUIRE(c.write("POST /v1/sessions/sm/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       "Transfer-Encoding: " +
                                       te + "\r\n\r\n" + smuggled));
            auto r = c.read_response();
            BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
            check_error(*r, 400, "invalid_request");
            BOOST_TEST(r->header("connection").value_or("") == "close");
            auto rest = c.read_until_close();
            BOOST_TEST(rest.closed);
            BOOST_TEST(rest.bytes.empty(), rest.bytes);
        }
    }
    auto c = connect();
    BOOST_TEST_REQUIRE(
        c.write("GET /v1/sessions/sm HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer a\r\n"
                "Authorization: Bearer b\r\n\r\n"));
    auto r = c.read_response();
    BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
    check_error(*r, 400, "invalid_request");
    // Two Idempotency-Keys: which one a retry must repeat would be a guess.
    auto k = connect();
    BOOST_TEST_REQUIRE(
        k.write("POST /v1/sessions/sm/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nIdempotency-Key: a\r\nidempotency-key: b\r\n"
                "Content-Length: 13\r\n\r\n{\"text\":\"hi\"}"));
    auto kr = k.read_response();
    BOOST_TEST_REQUIRE(kr.has_value(), k.last_error());
    check_error(*kr, 400, "invalid_request");
    BOOST_TEST(kr->body.find("Idempotency-Key given more than once") != std::string::npos, kr->body);
    // Nothing was stored.
    BOOST_TEST(request("GET", "/v1/sessions/sm").status == 404u);
}

// Without tokens the daemon trusts its clients; a web page the user visits is not one. A request
// from another origin, or addressed by a name that is not the loopback's (DNS rebinding), is
// refused; the daemon's own page (same origin) and clients that send no Origin are served.
BOOST_FIXTURE_TEST_CASE(without_tokens_other_origins_and_host_names_are_refused, daemon_fixture) {
    const std::string self = "127.0.0.1:" + std::to_string(daemon->port());
    auto raw = [&](std::string head) {
        auto c = connect();
        BOOST_REQUIRE(c.write(head + "\r\n"));
        auto r = c.read_response();
        BOOST_REQUIRE_MESSAGE(r.has_value(), c.last_error());
        return *r;
    };
    const std::string get = "GET /v1/sessions/o1 HTTP/1.1\r\n";
    auto evil_origin = raw(get + "Host: " + self + "\r\nOrigin: http://evil.example\r\n");
    check_error(evil_origin, 403, "forbidden");
    BOOST_TEST(evil_origin.body.find("Origin: http://evil.example") != std::string::npos,
               evil_origin.body);
    check_error(raw(get + "Host: " + self + "\r\nOrigin: null\r\n"), 403, "forbidden");
    auto rebound = raw(get + "Host: evil.example:" + std::to_string(daemon->port()) + "\r\n");
    check_error(rebound, 403, "forbidden");
    BOOST_TEST(rebound.body.find("not a loopback name") != std::string::npos, rebound.body);
    // A message from another origin is not stored.
    auto posted = raw("POST /v1/sessions/o1/messages HTTP/1.1\r\nHost: " + self +
                      "\r\nOrigin: http://evil.example\r\nContent-Length: 14\r\n\r\n{\"text\":\"hi\"}");
    check_error(posted, 403, "forbidden");
    // The WebSocket upgrade too.
    auto ws = raw(get.substr(0, 4) + "/v1/ws HTTP/1.1\r\nHost: " + self +
                  "\r\nOrigin: http://evil.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n");
    check_error(ws, 403, "forbidden");
    // Served: the same origin, loopback names, no Origin at all, and the open paths whatever asks.
    BOOST_TEST(raw(get + "Host: " + self + "\r\nOrigin: http://" + self + "\r\n").status == 404u);
    BOOST_TEST(raw(get + "Host: localhost:" + std::to_string(daemon->port()) + "\r\n").status == 404u);
    BOOST_TEST(raw(get + "Host: [::1]\r\n").status == 404u);
    BOOST_TEST(raw(get + "Host: LOCALHOST\r\nOrigin: http://localhost\r\n").status == 404u);
    BOOST_TEST(
        raw("GET /healthz HTTP/1.1\r\nHost: evil.example\r\nOrigin: http://evil.example\r\n").status ==
        200u);
    BOOST_TEST(request("GET", "/v1/sessions/o1").status == 404u);
}

BOOST_FIXTURE_TEST_CASE(bad_input_costs_no_health_and_no_data, daemon_fixture) {
    std::string tid = turn_id_of(post_message("survivor", "keep me"));
    auto before = wait_for_turn(tid, {"completed"});

    const std::string post = "/v1/sessions/survivor/messages";
    struct abuse {
        std::string bytes;
        unsigned status; // 0: the client hangs up without waiting for an answer
        std::string code;
    };
    const std::vector<abuse> cases{
        {"this is not http\r\n\r\n", 400, "invalid_request"},
        {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "invalid_request"},
        {std::string("\0\0\0\0\r\n\r\n", 8), 400, "invalid_request"},
        {"GET /healthz HTTP/1.1\r\nX-Big: " + std::string(20000, 'x') + "\r\n\r\n", 431,
         "invalid_request"},
        {"POST " + post + " HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413, "payload_too_large"},
        {"GET /v1/turns/" + std::string(10000, 'x') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404,
         "not_found"},
        {"GET /healthz HTTP/1.1\r\n\r\n", 400, "invalid_request"}, // no Host
        {"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "invalid_request"},
        {format_request("POST", post, "{\"text\": \"\xff\"}"), 400, "invalid_json"},
        {format_request("POST", post, std::string(10000, '[')), 400, "invalid_json"},
        {format_request("POST", post, R"({"text": 1})"), 400, "invalid_request"},
        {format_request("POST", post, R"({"text": "x"})", {{"Content-Type", "text/plain"}}), 415,
         "unsupported_media_type"},
        {"POST " + post + " HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"text\":", 0, ""},
        {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", 0, ""},
        {"", 0, ""},
    };
    for (std::size_t i = 0; i < cases.size(); ++i)
        BOOST_TEST_CONTEXT("case " << i) {
            auto c = connect();
            BOOST_TEST_REQUIRE(c.write(cases[i].bytes), c.last_error());
            if (cases[i].status == 0) continue;
            auto r = c.read_response();
            BOOST_TEST_REQUIRE(r.has_value(), c.last_error());
            check_error(*r, cases[i].status, cases[i].code);
        }

    BOOST_TEST(request("GET", "/healthz").status == 200u);
    BOOST_TEST(request("GET", "/readyz").status == 200u);
    auto after = request("GET", "/v1/turns/" + tid);
    BOOST_TEST(after.status == 200u, after.body);
    BOOST_TEST(json::serialize(body_object(after)) == json::serialize(before));
    BOOST_TEST(int_at(body_object(request("GET", "/v1/sessions/survivor")), "turns") == 1);
    BOOST_TEST((user_texts(*this, "survivor") == std::vector<std::string>{"keep me"}));
    auto next = post_message("survivor", "still here");
    BOOST_TEST_REQUIRE(next.status == 202u, next.body);
    BOOST_TEST(string_at(wait_for_turn(turn_id_of(next)), "reply") == "echo: still here");
}

BOOST_AUTO_TEST_SUITE_END()

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

// Found by a new-user check: with stderr a pipe whose reader had gone (`2>&1 | head`, a log
// shipper restarting), the next log line killed the daemon with SIGPIPE; SIGHUP killed it at once.
BOOST_AUTO_TEST_CASE(a_gone_log_reader_does_not_kill_the_daemon_and_sighup_drains) {
    scratch_dir dir;
    auto fifo = dir.root / "stderr.fifo";
    BOOST_TEST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    BOOST_TEST_REQUIRE(reader >= 0);
    daemon_process d({"serve", "--listen", "127.0.0.1:0", "--data", (dir.root / "data").string()}, fifo);
    ::close(reader); // every log line from here on meets a pipe without a reader
    connection c(d.host(), d.port());
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
    // The drain logs "stopping" and "stopped" on its way out: a clean exit, not 128 + SIGPIPE.
    BOOST_TEST_REQUIRE(::kill(d.pid(), SIGHUP) == 0);
    BOOST_TEST(d.stop() == 0, "exit code after SIGHUP, its log's reader gone");
}

// Found by a new-user check: the signal handlers were set after `listening on` was printed, and
// a signal sent as soon as it came killed the daemon outright about 1 start in 8.
BOOST_AUTO_TEST_CASE(a_signal_as_soon_as_it_listens_drains) {
    scratch_dir dir;
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGTERM, SIGINT, SIGHUP}) {
        daemon_process d({"serve", "--listen", "127.0.0.1:0", "--data", (dir.root / "data").string()},
                         dir.root / "log");
        BOOST_TEST_REQUIRE(::kill(d.pid(), sig) == 0);
        BOOST_TEST(d.stop() == 0, "exit code after signal " << sig << " at once");
    }
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

BOOST_AUTO_TEST_CASE(serve_refuses_a_malformed_listen_address_as_such) {
    scratch_dir dir;
    // Without tokens too: the refusal of a remote address is not what a malformed one gets.
    for (const char* bad : {"foo", "127.0.0.1:http", "example.com:80"}) {
        auto r = run_baton({"serve", "--listen", bad, "--data", (dir.root / "data").string()});
        BOOST_TEST(r.exit_code == 2, r.output);
        BOOST_TEST(r.output.find("--listen: expected IP:PORT") != std::string::npos, r.output);
        BOOST_TEST(r.output.find("refusing") == std::string::npos, r.output);
    }
}

// Found by a new-user check: `serve --bogus` said "--bogus needs a value"; `--data ""` put the
// database in the working directory; `token hash --help` exited 2.
BOOST_AUTO_TEST_CASE(serve_names_a_bad_argument_for_what_it_is) {
    for (auto [args, said] : {std::pair<std::vector<std::string>, std::string>{{"serve", "--bogus"},
                                                                               "unknown option --bogus"},
                              {{"serve", "extra"}, "unexpected argument extra"},
                              {{"serve", "--data", ""}, "--data: expected a directory"},
                              {{"serve", "--data="}, "--data: expected a directory"}}) {
        auto r = run_baton(args);
        BOOST_TEST(r.exit_code == 2, r.output);
        BOOST_TEST(r.output.find(said) != std::string::npos, r.output);
    }
    auto help = run_baton({"token", "hash", "--help"});
    BOOST_TEST(help.exit_code == 0, help.output);
    BOOST_TEST(help.output.find("baton token hash") != std::string::npos, help.output);
}

BOOST_AUTO_TEST_CASE(version_exits_0) {
    auto r = run_baton({"--version"});
    BOOST_TEST(r.exit_code == 0, r.output);
    BOOST_TEST(r.output.starts_with("baton "), r.output);
}

BOOST_AUTO_TEST_SUITE_END()
