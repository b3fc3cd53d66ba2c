// HTTP routing and body validation, without sockets.
#include "channels/http/api.hpp"
#include "channels/http/router.hpp"

#include <boost/test/unit_test.hpp>

using namespace baton;
using namespace baton::http;

BOOST_AUTO_TEST_SUITE(http_router)

BOOST_AUTO_TEST_CASE(routes_and_parameters) {
    auto m = match_route("POST", "/v1/sessions/s1/messages");
    BOOST_TEST((m.id == route_id::post_message));
    BOOST_TEST(m.session_id == "s1");
    m = match_route("GET", "/v1/turns/t_abc");
    BOOST_TEST((m.id == route_id::get_turn));
    BOOST_TEST(m.turn_id == "t_abc");
    m = match_route("GET", "/v1/sessions/a%3Ab/tape?after=3&limit=2");
    BOOST_TEST((m.id == route_id::get_tape));
    BOOST_TEST(m.session_id == "a:b");
    BOOST_TEST(*query_param_int(m.query, "after").value == 3);
    BOOST_TEST(*query_param_int(m.query, "limit").value == 2);
    BOOST_TEST(!query_param_int(m.query, "other").value);
    BOOST_TEST(!query_param_int("after=-1", "after").error.empty());
    BOOST_TEST(!query_param_int("after=1x", "after").error.empty());
    // A repeated parameter is an error without a value, whatever the values (even equal ones).
    for (const char* q : {"limit=2&limit=5", "limit=23&limit=10z", "limit=2&after=1&limit=2"}) {
        auto twice = query_param_int(q, "limit");
        BOOST_TEST(twice.error == "limit: given more than once");
        BOOST_TEST(!twice.value);
    }
    BOOST_TEST(*query_param_int("limit=2&after=1", "after").value == 1);
    BOOST_TEST(!query_param_wait("wait=1&wait=99").value);
    BOOST_TEST(query_param_wait("wait=1&wait=99").error == "wait: given more than once");
    BOOST_TEST(query_param("status=failed&status=pending", "status").error ==
               "status: given more than once");
    BOOST_TEST(*query_param("status=failed", "status").value == "failed");
    BOOST_TEST(!query_param("a=1", "status").value);
    // Percent-decoded, key and value alike.
    BOOST_TEST(*query_param_wait("wait=%33").value == std::chrono::milliseconds(3000));
    BOOST_TEST(*query_param_int("%6cimit=%31%30", "limit").value == 10);
    BOOST_TEST(*query_param("status=deliver%65d", "status").value == "delivered");
    BOOST_TEST(query_param("limit=1&%6cimit=2", "limit").error == "limit: given more than once");
    BOOST_TEST(!query_param_int("limit=%zz", "limit").value);
    BOOST_TEST(query_param("a=1", "status").error.empty());
    BOOST_TEST((match_route("GET", "/healthz").id == route_id::healthz));
    BOOST_TEST((match_route("GET", "/v1/turns/t_x/").id == route_id::get_turn));
}

BOOST_AUTO_TEST_CASE(root_is_the_web_page) {
    BOOST_TEST((match_route("GET", "/").id == route_id::web_page));
    // The page reads its session from the query or the fragment: still the same page.
    auto m = match_route("GET", "/?session=s1");
    BOOST_TEST((m.id == route_id::web_page));
    BOOST_TEST(m.query == "session=s1");
    m = match_route("POST", "/");
    BOOST_TEST((m.error == errc::method_not_allowed));
    BOOST_TEST(m.allow == "GET, HEAD");
}

BOOST_AUTO_TEST_CASE(unknown_paths_and_wrong_methods) {
    auto m = match_route("GET", "/v1/nothing");
    BOOST_TEST((m.error == errc::not_found));
    m = match_route("DELETE", "/v1/turns/t1");
    BOOST_TEST((m.error == errc::method_not_allowed));
    BOOST_TEST(m.allow == "GET, HEAD");
    m = match_route("GET", "/v1/sessions/s1/messages");
    BOOST_TEST((m.error == errc::method_not_allowed));
    BOOST_TEST(m.allow == "POST");
    BOOST_TEST((match_route("GET", "not a target").error == errc::invalid_request));
}

BOOST_AUTO_TEST_CASE(long_paths_and_long_ids) {
    // Ids longer than a short string, percent-decoded; four parts and a trailing slash still route.
    auto m = match_route("POST", "/v1/sessions/user%40example.com:chat-2026-long/messages/");
    BOOST_TEST((m.id == route_id::post_message));
    BOOST_TEST(m.session_id == "user@example.com:chat-2026-long");
    BOOST_TEST(m.allow.empty());
    m = match_route("GET", "/v1/turns/t_0123456789abcdef0123456789/events");
    BOOST_TEST((m.id == route_id::turn_events));
    BOOST_TEST(m.turn_id == "t_0123456789abcdef0123456789");
    // More segments than any route has: not found, whatever they hold.
    for (auto target : {"/v1/turns/t1/events/x", "/v1/turns/t1/events/x/", "/v1/a/b/c/d/e/f/g",
                        "/v1/sessions/s1/messages/x/y"}) {
        m = match_route("GET", target);
        BOOST_TEST((m.error == errc::not_found), target);
        BOOST_TEST((m.id == route_id::none), target);
    }
    BOOST_TEST((match_route("GET", "//").error == errc::not_found));
}

BOOST_AUTO_TEST_CASE(message_bodies) {
    accept_request r;
    BOOST_TEST(!parse_message_body(
        R"({"text":"hi","agent":"a","metadata":{"k":1},"deliver":{"channel":"webhook","to":"crm"}})",
        r));
    BOOST_TEST(r.text == "hi");
    BOOST_TEST(r.agent == "a");
    BOOST_TEST(r.metadata.at("k").as_int64() == 1);
    auto err = [](std::string_view body) {
        accept_request ar;
        auto e = parse_message_body(body, ar);
        BOOST_REQUIRE(e);
        return *e;
    };
    BOOST_TEST((err("{").code == errc::invalid_json));
    BOOST_TEST((err("\"\xff\"").code == errc::invalid_json));
    BOOST_TEST((err("[]").code == errc::invalid_request));
    BOOST_TEST(err("{}").message == "text: required");
    BOOST_TEST(err(R"({"text":1})").message == "text: expected string");
    BOOST_TEST(err(R"({"text":""})").message == "text: must not be empty");
    BOOST_TEST(err(R"({"text":"a","metadata":[]})").message == "metadata: expected object");
    BOOST_TEST(err(R"({"text":"a","deliver":{"to":"x"}})").message == "deliver.channel: required");
    BOOST_TEST(err(R"({"text":"a","color":"red"})").message == "color: unknown field");
    BOOST_TEST(err(R"({"text":"a","text":"a"})").message == "text: duplicate key");
    BOOST_TEST(err(R"({"text":"a","metadata":{"x y":[{"k":1,"k":2}]}})").message ==
               R"(metadata["x y"][0].k: duplicate key)");
}

BOOST_AUTO_TEST_CASE(utf8_validation) {
    BOOST_TEST(valid_utf8("plain"));
    BOOST_TEST(valid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
    BOOST_TEST(!valid_utf8("\xc3"));             // truncated
    BOOST_TEST(!valid_utf8("\xc0\xaf"));         // overlong
    BOOST_TEST(!valid_utf8("\xed\xa0\x80"));     // surrogate
    BOOST_TEST(!valid_utf8("\xf4\x90\x80\x80")); // past U+10FFFF
}

BOOST_AUTO_TEST_SUITE_END()
