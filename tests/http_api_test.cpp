// End-to-end tests of the REST surface (docs/api.md "HTTP API") against the real `baton serve` process,
// through its socket only. Connection-level behaviour (framing, limits, timeouts) is in
// http_daemon_test.cpp, in the same suite.
#include "tests/daemon_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <set>
#include <string>
#include <vector>

using namespace baton::test;

namespace {

std::set<std::string> allow_set(const http_response& r) {
    std::set<std::string> out;
    std::string allow = r.header("Allow").value_or("");
    std::size_t pos = 0;
    while (pos <= allow.size()) {
        auto comma = std::min(allow.find(',', pos), allow.size());
        std::string item = allow.substr(pos, comma - pos);
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        if (!item.empty()) out.insert(item);
        pos = comma + 1;
    }
    return out;
}

const std::string post_target = "/v1/sessions/s1/messages";

} // namespace

BOOST_AUTO_TEST_SUITE(http_api)

BOOST_FIXTURE_TEST_CASE(posted_message_completes_with_the_echo_reply, daemon_fixture) {
    auto r = post_message("s1", "hello there");
    BOOST_TEST(r.status == 202u, r.body);
    const auto& accepted = body_object(r);
    std::string tid = turn_id_of(r);
    BOOST_TEST(string_at(accepted, "session_id") == "s1");
    BOOST_TEST(string_at(accepted, "status") == "queued");
    BOOST_TEST(!accepted.contains("replayed"));
    const auto* links = accepted.contains("links") ? accepted.at("links").if_object() : nullptr;
    BOOST_TEST_REQUIRE(links != nullptr, r.body);
    BOOST_TEST(string_at(*links, "turn") == "/v1/turns/" + tid);
    BOOST_TEST(string_at(*links, "events") == "/v1/turns/" + tid + "/events");
    BOOST_TEST(r.header("Location").value_or("") == "/v1/turns/" + tid);

    auto rec = wait_for_turn(tid, {"completed"});
    const std::set<std::string> fields{"turn_id", "session_id", "agent",      "status",
                                       "reply",   "steps",      "attempt",    "usage",
                                       "error",   "created_at", "started_at", "finished_at"};
    BOOST_TEST(keys_of(rec) == fields);
    BOOST_TEST(string_at(rec, "turn_id") == tid);
    BOOST_TEST(string_at(rec, "session_id") == "s1");
    BOOST_TEST(string_at(rec, "agent") == "default");
    BOOST_TEST(string_at(rec, "reply") == "echo: hello there");
    BOOST_TEST(int_at(rec, "steps") == 1);
    BOOST_TEST(rec.at("error").is_null());
    const auto* usage = rec.at("usage").if_object();
    BOOST_TEST_REQUIRE(usage != nullptr);
    BOOST_TEST((keys_of(*usage) == std::set<std::string>{"prompt_tokens", "completion_tokens"}));
    BOOST_TEST(int_at(*usage, "prompt_tokens") > 0);
    BOOST_TEST(int_at(*usage, "completion_tokens") > 0);
    for (const char* t : {"created_at", "started_at", "finished_at"})
        BOOST_TEST(is_rfc3339(rec.at(t)), t << " = " << json::serialize(rec.at(t)));
    // Same format and zone, so the strings order like the instants.
    BOOST_TEST(string_at(rec, "created_at") <= string_at(rec, "started_at"));
    BOOST_TEST(string_at(rec, "started_at") <= string_at(rec, "finished_at"));
}

BOOST_FIXTURE_TEST_CASE(help_command_completes_without_a_model_step, daemon_fixture) {
    auto r = post_message("cmd", "/help");
    BOOST_TEST(r.status == 202u, r.body);
    auto rec = wait_for_turn(turn_id_of(r), {"completed"});
    BOOST_TEST(int_at(rec, "steps") == 0);
    BOOST_TEST(string_at(rec, "reply").find("/help") != std::string::npos, json::serialize(rec));
    BOOST_TEST(!string_at(rec, "reply").starts_with("echo:"));
    BOOST_TEST(json::serialize(rec.at("usage")) == R"({"prompt_tokens":0,"completion_tokens":0})");
}

BOOST_FIXTURE_TEST_CASE(session_reports_turns_and_last_turn, daemon_fixture) {
    std::string first = turn_id_of(post_message("sess-1", "one"));
    std::string second = turn_id_of(post_message("sess-1", "two"));
    wait_for_turn(first);
    wait_for_turn(second);

    auto r = request("GET", "/v1/sessions/sess-1");
    BOOST_TEST(r.status == 200u, r.body);
    const auto& s = body_object(r);
    BOOST_TEST((keys_of(s) == std::set<std::string>{"session_id", "agent", "turns", "busy", "queued",
                                                    "last_turn_id", "state"}));
    BOOST_TEST(string_at(s, "session_id") == "sess-1");
    BOOST_TEST(string_at(s, "agent") == "default");
    BOOST_TEST(int_at(s, "turns") == 2);
    BOOST_TEST(s.at("busy").is_bool());
    BOOST_TEST(!s.at("busy").as_bool());
    BOOST_TEST(int_at(s, "queued") == 0);
    BOOST_TEST(string_at(s, "last_turn_id") == second);
    BOOST_TEST(json::serialize(s.at("state")) == "{}");
}

BOOST_FIXTURE_TEST_CASE(tape_lists_entries_and_pages_with_after_and_limit, daemon_fixture) {
    std::vector<std::string> tids;
    for (const char* text : {"one", "two", "/handoff topic"})
        tids.push_back(turn_id_of(post_message("tape-1", text)));
    for (const auto& tid : tids)
        wait_for_turn(tid, {"completed"});

    auto all = request("GET", "/v1/sessions/tape-1/tape");
    BOOST_TEST_REQUIRE(all.status == 200u, all.body);
    const auto& root = body_object(all);
    BOOST_TEST((keys_of(root) == std::set<std::string>{"entries", "next_after"}));
    const auto& entries = root.at("entries").as_array();
    std::vector<std::int64_t> ids;
    std::vector<std::string> user_texts, assistant_texts, anchors;
    for (const auto& v : entries) {
        const auto& e = v.as_object();
        BOOST_TEST((keys_of(e) == std::set<std::string>{"id", "kind", "payload", "created_at"}));
        BOOST_TEST(is_rfc3339(e.at("created_at")));
        if (!ids.empty()) BOOST_TEST(int_at(e, "id") > ids.back());
        ids.push_back(int_at(e, "id"));
        const auto& p = e.at("payload").as_object();
        std::string kind = string_at(e, "kind");
        if (kind == "message") {
            BOOST_TEST((keys_of(p) == std::set<std::string>{"role", "text"}));
            (string_at(p, "role") == "user" ? user_texts : assistant_texts)
                .push_back(string_at(p, "text"));
        } else if (kind == "anchor") {
            BOOST_TEST((keys_of(p) == std::set<std::string>{"name", "summary"}));
            anchors.push_back(string_at(p, "name"));
        } else {
            BOOST_TEST(false, "unexpected kind " << kind);
        }
    }
    BOOST_TEST((user_texts == std::vector<std::string>{"one", "two", "/handoff topic"}));
    BOOST_TEST_REQUIRE(assistant_texts.size() == 3u);
    BOOST_TEST(assistant_texts[0] == "echo: one");
    BOOST_TEST(assistant_texts[1] == "echo: two");
    BOOST_TEST((anchors == std::vector<std::string>{"topic"}));
    BOOST_TEST(int_at(root, "next_after") == ids.back());

    // Pages of two, each starting after the previous page's next_after, give the same entries.
    std::vector<std::int64_t> paged;
    std::int64_t after = 0;
    for (int page = 0; page < 10; ++page) {
        auto r = request("GET", "/v1/sessions/tape-1/tape?after=" + std::to_string(after) + "&limit=2");
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        const auto& got = body_object(r).at("entries").as_array();
        BOOST_TEST(got.size() <= 2u);
        for (const auto& e : got)
            paged.push_back(int_at(e.as_object(), "id"));
        std::int64_t next = int_at(body_object(r), "next_after");
        if (got.empty()) {
            BOOST_TEST(next == after);
            break;
        }
        BOOST_TEST(next == paged.back());
        after = next;
    }
    BOOST_TEST(paged == ids);

    check_error(request("GET", "/v1/sessions/tape-1/tape?limit=abc"), 400, "invalid_request");
    check_error(request("GET", "/v1/sessions/tape-1/tape?after=-1"), 400, "invalid_request");
}

BOOST_FIXTURE_TEST_CASE(idempotency_key_replays_the_same_turn, daemon_fixture) {
    const header_list key{{"Idempotency-Key", "order-42"}};
    auto first = post_message("idem", "pay once", key);
    BOOST_TEST(first.status == 202u, first.body);
    std::string tid = turn_id_of(first);

    auto again = post_message("idem", "pay once", key);
    BOOST_TEST(again.status == 200u, again.body);
    BOOST_TEST(turn_id_of(again) == tid);
    const auto* replayed = body_object(again).if_contains("replayed");
    BOOST_TEST((replayed && replayed->is_bool() && replayed->get_bool()), again.body);
    BOOST_TEST(again.header("Location").value_or("") == "/v1/turns/" + tid);

    wait_for_turn(tid, {"completed"});
    auto late = post_message("idem", "pay once", key);
    BOOST_TEST(late.status == 200u, late.body);
    BOOST_TEST(turn_id_of(late) == tid);
    BOOST_TEST(string_at(body_object(late), "status") == "completed");

    // One turn ran: the session counts one and its tape holds one exchange.
    BOOST_TEST(int_at(body_object(request("GET", "/v1/sessions/idem")), "turns") == 1);
    auto tape = request("GET", "/v1/sessions/idem/tape");
    BOOST_TEST(body_object(tape).at("entries").as_array().size() == 2u, tape.body);
}

BOOST_FIXTURE_TEST_CASE(idempotency_key_with_another_body_is_409, daemon_fixture) {
    const header_list key{{"Idempotency-Key", "k-1"}};
    std::string tid = turn_id_of(post_message("idem2", "first", key));
    check_error(post_message("idem2", "second", key), 409, "idempotency_key_reused");
    wait_for_turn(tid, {"completed"});
    check_error(post_message("idem2", "third", key), 409, "idempotency_key_reused");

    BOOST_TEST(int_at(body_object(request("GET", "/v1/sessions/idem2")), "turns") == 1);
    auto tape = request("GET", "/v1/sessions/idem2/tape");
    const auto& entries = body_object(tape).at("entries").as_array();
    BOOST_TEST_REQUIRE(entries.size() == 2u, tape.body);
    BOOST_TEST(string_at(entries[0].at("payload").as_object(), "text") == "first");
}

BOOST_FIXTURE_TEST_CASE(health_and_readiness_answer_ok, daemon_fixture) {
    for (const char* target : {"/healthz", "/readyz"}) {
        auto r = request("GET", target);
        BOOST_TEST(r.status == 200u, target);
        BOOST_TEST(r.body == R"({"status":"ok"})", target);
    }
}

BOOST_FIXTURE_TEST_CASE(root_serves_the_web_chat_page, daemon_fixture) {
    auto r = request("GET", "/?session=s1");
    BOOST_TEST(r.status == 200u);
    BOOST_TEST(r.header("Content-Type").value_or("") == "text/html; charset=utf-8");
    BOOST_TEST(r.body.starts_with("<!doctype html>"));
    // The page is a client of the WebSocket channel, on the same host.
    BOOST_TEST(r.body.find("/v1/ws") != std::string::npos);
    BOOST_TEST(r.body.find("</html>") != std::string::npos);
}

BOOST_FIXTURE_TEST_CASE(unknown_path_is_404, daemon_fixture) {
    for (const char* target : {"/v1/nope", "/v2/turns/x", "/v1", "/v1/sessions/s1/messages/extra"})
        BOOST_TEST_CONTEXT(target) {
            check_error(request("GET", target), 404, "not_found");
        }
}

BOOST_FIXTURE_TEST_CASE(wrong_method_is_405_with_allow, daemon_fixture) {
    struct item {
        const char* method;
        const char* target;
        std::set<std::string> allow;
    };
    const std::vector<item> items{{"GET", "/v1/sessions/s1/messages", {"POST"}},
                                  {"DELETE", "/v1/turns/t_x", {"GET", "HEAD"}},
                                  {"PUT", "/v1/sessions/s1", {"GET", "HEAD"}},
                                  {"POST", "/healthz", {"GET", "HEAD"}}};
    for (const auto& it : items)
        BOOST_TEST_CONTEXT(it.method << " " << it.target) {
            auto r = request(it.method, it.target);
            check_error(r, 405, "method_not_allowed");
            BOOST_TEST(allow_set(r) == it.allow);
        }
}

// HEAD is GET without the body (RFC 9110 9.3.2); it was 405. A body sent by mistake would be
// read as the next response on a keep-alive connection, hence the GET after it.
BOOST_FIXTURE_TEST_CASE(head_answers_as_get_without_the_body, daemon_fixture) {
    std::string tid(post_message("s1", "hi").json.at("turn_id").as_string());
    wait_for_turn(tid); // the GET and the HEAD of each pair must see the same record
    auto c = connect();
    for (std::string target :
         {std::string("/healthz"), "/v1/turns/" + tid, std::string("/v1/sessions/s1"),
          std::string("/v1/turns/t_01m8p3g4mhdmdqxn8qwp6jwrbk")}) {
        BOOST_TEST_CONTEXT(target) {
            auto get = c.request("GET", target);
            auto head = c.request("HEAD", target);
            BOOST_TEST(head.status == get.status);
            BOOST_TEST(head.body.empty());
            BOOST_TEST(head.header("Content-Type").value_or("") ==
                       get.header("Content-Type").value_or("x"));
            if (get.status == 200u)
                BOOST_TEST(head.header("Content-Length").value_or("") ==
                           std::to_string(get.body.size()));
        }
    }
    BOOST_TEST(c.request("GET", "/healthz").json.at("status").as_string() == "ok");
    auto refused = c.request("HEAD", "/v1/sessions/s1/messages");
    BOOST_TEST(refused.status == 405u);
    BOOST_TEST(refused.header("Allow").value_or("") == "POST");
    BOOST_TEST(refused.body.empty());
    BOOST_TEST(c.request("GET", "/healthz").status == 200u);
}

BOOST_FIXTURE_TEST_CASE(invalid_json_is_400_invalid_json, daemon_fixture) {
    for (const char* body : {R"({"text": "hi")", "not json", R"({"text": "hi"} trailing)"})
        BOOST_TEST_CONTEXT(body) {
            check_error(request("POST", post_target, body), 400, "invalid_json");
        }
}

BOOST_FIXTURE_TEST_CASE(invalid_utf8_is_400_invalid_json, daemon_fixture) {
    // A lone continuation byte, an overlong '/', an encoded surrogate.
    const std::vector<std::string> bad{"\xff", "\xc0\xaf", "\xed\xa0\x80"};
    for (std::size_t i = 0; i < bad.size(); ++i)
        BOOST_TEST_CONTEXT("case " << i) {
            check_error(request("POST", post_target, R"({"text": ")" + bad[i] + R"("})"), 400,
                        "invalid_json");
        }
}

BOOST_FIXTURE_TEST_CASE(wrong_types_are_400_naming_the_field, daemon_fixture) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {R"({"text": 1})", "text"},
        {R"({"text": "hi", "metadata": "x"})", "metadata"},
        {R"({"text": "hi", "deliver": 3})", "deliver"},
        {R"({"text": "hi", "agent": false})", "agent"},
    };
    for (const auto& [body, field] : cases)
        BOOST_TEST_CONTEXT(body) {
            auto message = check_error(request("POST", post_target, body), 400, "invalid_request");
            BOOST_TEST(message.find(field) != std::string::npos, message);
        }
    check_error(request("POST", post_target, "[1, 2]"), 400, "invalid_request");
}

BOOST_FIXTURE_TEST_CASE(missing_text_is_400, daemon_fixture) {
    for (const char* body : {"{}", R"({"metadata": {}})"})
        BOOST_TEST_CONTEXT(body) {
            auto message = check_error(request("POST", post_target, body), 400, "invalid_request");
            BOOST_TEST(message.find("text") != std::string::npos, message);
        }
}

BOOST_FIXTURE_TEST_CASE(unknown_field_is_400, daemon_fixture) {
    auto message = check_error(request("POST", post_target, R"({"text": "hi", "colour": "red"})"), 400,
                               "invalid_request");
    BOOST_TEST(message.find("colour") != std::string::npos, message);
}

BOOST_FIXTURE_TEST_CASE(duplicate_keys_are_400_naming_the_key_and_store_nothing, daemon_fixture) {
    // The ninth and later keys of an object are checked too (another code path of the check).
    std::string many = R"({"text": "hi", "metadata": {)";
    for (int i = 0; i < 20; ++i)
        many += "\"k" + std::to_string(i) + "\": " + std::to_string(i) + ",";
    many += R"("k3": 0}})";
    const std::vector<std::pair<std::string, std::string>> cases{
        {R"({"text": "one", "text": "two"})", "text: duplicate key"},
        {R"({"text": "hi", "metadata": {"a": 1, "b": {"c": 1, "c": 2}}})", "metadata.b.c: duplicate key"},
        {R"({"text": "hi", "deliver": {"channel": "webhook", "channel": "x"}})",
         "deliver.channel: duplicate key"},
        {many, "metadata.k3: duplicate key"},
    };
    for (const auto& [body, expected] : cases)
        BOOST_TEST_CONTEXT(body) {
            BOOST_TEST(check_error(request("POST", post_target, body), 400, "invalid_request") == expected);
        }
    check_error(request("GET", "/v1/sessions/s1"), 404, "not_found");
    // The same key in two objects is no duplicate.
    BOOST_TEST(request("POST", post_target, R"({"text": "hi", "metadata": {"text": {"text": 1}}})").status ==
               202u);
}

BOOST_FIXTURE_TEST_CASE(invalid_session_id_is_400, daemon_fixture) {
    const std::string too_long(129, 'a');
    for (const std::string& sid : {too_long, std::string("a%20b"), std::string("caf%C3%A9")})
        BOOST_TEST_CONTEXT(sid) {
            check_error(post_message(sid, "hi"), 400, "invalid_request");
            check_error(request("GET", "/v1/sessions/" + sid), 400, "invalid_request");
            check_error(request("GET", "/v1/sessions/" + sid + "/tape"), 400, "invalid_request");
        }
    // A '/' makes another path, which names no resource.
    check_error(post_message("a/b", "hi"), 404, "not_found");
    // 128 characters of the whole alphabet are fine.
    std::string longest = "Az09._:@-";
    longest.resize(128, 'x');
    auto ok = post_message(longest, "hi");
    BOOST_TEST(ok.status == 202u, ok.body);
    BOOST_TEST(string_at(wait_for_turn(turn_id_of(ok)), "session_id") == longest);
}

BOOST_FIXTURE_TEST_CASE(non_json_content_type_is_415, daemon_fixture) {
    // An empty one too: only an absent Content-Type is taken as JSON.
    for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "application/xml", ""})
        BOOST_TEST_CONTEXT(type) {
            check_error(request("POST", post_target, R"({"text": "hi"})", {{"Content-Type", type}}), 415,
                        "unsupported_media_type");
        }
    auto ok = request("POST", post_target, R"({"text": "hi"})",
                      {{"Content-Type", "application/json; charset=utf-8"}});
    BOOST_TEST(ok.status == 202u, ok.body);
}

BOOST_FIXTURE_TEST_CASE(unknown_turn_is_404, daemon_fixture) {
    // Well-formed but never issued, and not even well-formed.
    for (const char* tid : {"t_0000000000000000000000000a", "nope", "t_%2e%2e"})
        BOOST_TEST_CONTEXT(tid) {
            check_error(request("GET", std::string("/v1/turns/") + tid), 404, "not_found");
        }
}

BOOST_FIXTURE_TEST_CASE(unknown_session_is_404, daemon_fixture) {
    check_error(request("GET", "/v1/sessions/never-seen/tape"), 404, "not_found");
    check_error(request("GET", "/v1/sessions/never-seen"), 404, "not_found");
}

BOOST_AUTO_TEST_SUITE_END()
