// Per-tenant limits (docs/api.md "Quotas"), in the test's process on a manual clock: the rate
// (GCRA) refuses with the Retry-After the clock says and lets through when it has passed; a tenant
// at max_running_turns waits in its queues while another tenant's turns run at once.
#include "tests/clocked_service.hpp"

#include <baton/runtime.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <deque>

using namespace baton;
using namespace baton::test;

namespace {

// A model whose calls each wait until the test releases them, one by one, by their message.
struct held_model : model_client {
    explicit held_model(asio::any_io_executor ex) : ex(std::move(ex)) {}
    asio::any_io_executor ex;
    std::mutex mutex;
    std::vector<std::pair<std::string, std::shared_ptr<asio::steady_timer>>> held;
    std::vector<std::string> called; // the messages, in call order

    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        auto text = req.messages.back().content;
        auto gate = std::make_shared<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
        {
            std::lock_guard lock(mutex);
            held.emplace_back(text, gate);
            called.push_back(text);
        }
        co_await gate->async_wait(asio::as_tuple(asio::use_awaitable));
        chat_completion c;
        c.text = "done: " + text;
        c.prompt_tokens = 10;
        c.completion_tokens = 5;
        c.has_usage = true;
        co_return c;
    }
    std::string name() const override { return "held"; }
    std::vector<std::string> calls() {
        std::lock_guard lock(mutex);
        return called;
    }
    void release_all() {
        std::lock_guard lock(mutex);
        for (auto& [t, gate] : held)
            asio::post(ex, [g = gate] { g->cancel(); });
    }
    void release(const std::string& text) {
        std::lock_guard lock(mutex);
        for (auto& [t, gate] : held)
            if (t == text) asio::post(ex, [g = gate] { g->cancel(); });
    }
};

accept_request from(std::string tenant, std::string session, std::string text) {
    accept_request m;
    m.tenant = std::move(tenant);
    m.session_id = std::move(session);
    m.text = std::move(text);
    return m;
}

service_options with_limits(std::map<std::string, tenant_limits> limits) {
    auto o = clocked_service::memory_options();
    for (auto& [name, l] : limits)
        o.config.tenants[name].limits = l;
    return o;
}

tenant_stats stats_of(clocked_service& s, const std::string& tenant) {
    for (auto& t : s.svc->runtime().tenants())
        if (t.tenant == tenant) return t;
    return {};
}

} // namespace

BOOST_AUTO_TEST_SUITE(tenant_quotas)

BOOST_AUTO_TEST_CASE(the_rate_refuses_with_retry_after_until_the_clock_has_moved) {
    tenant_limits l;
    l.turns_per_minute = 2; // a bucket of two, one more every 30 s
    clocked_service s(with_limits({{"a", l}}));
    auto model = std::make_shared<held_model>(s.io.get_executor());
    agent_config cfg;
    s.svc->add_agent(cfg, model);
    s.start();
    auto& rt = s.svc->runtime();
    BOOST_TEST(s.run(rt.accept(from("a", "s1", "1"))).has_value());
    BOOST_TEST(s.run(rt.accept(from("a", "s2", "2"))).has_value());
    auto refused = s.run(rt.accept(from("a", "s1", "3")));
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST((refused.error().code == errc::rate_limited));
    BOOST_TEST(refused.error().retry_after_s == 30);
    // Another tenant is not slowed: no limit of its own, none of a's.
    for (int i = 0; i < 10; ++i)
        BOOST_TEST(s.run(rt.accept(from("b", "s1", std::to_string(i)))).has_value());
    s.clock->advance(std::chrono::seconds(29));
    refused = s.run(rt.accept(from("a", "s1", "3")));
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST(refused.error().retry_after_s == 1);
    s.clock->advance(std::chrono::seconds(1));
    BOOST_TEST(s.run(rt.accept(from("a", "s1", "3"))).has_value());
    // Nothing refused was stored: a's s1 holds the two messages let through, not the refused ones.
    BOOST_TEST(s.run(rt.get_session({"a", "s1"}))->record.turns == 2);
    BOOST_TEST(stats_of(s, "a").rate_limited == 2);
    BOOST_TEST(eventually([&] {
        model->release_all(); // b's s1 runs its ten one after the other
        return s.svc->runtime().running_turns() == 0 && s.svc->runtime().queued_turns() == 0;
    }));
    s.stop();
}

BOOST_AUTO_TEST_CASE(a_tenant_at_max_running_turns_waits_while_another_runs) {
    tenant_limits l;
    l.max_running_turns = 1;
    clocked_service s(with_limits({{"a", l}}));
    auto model = std::make_shared<held_model>(s.io.get_executor());
    agent_config cfg;
    s.svc->add_agent(cfg, model);
    s.start();
    auto& rt = s.svc->runtime();
    auto a1 = s.run(rt.accept(from("a", "s1", "a1"))).value();
    auto a2 = s.run(rt.accept(from("a", "s2", "a2"))).value();
    auto a3 = s.run(rt.accept(from("a", "s3", "a3"))).value();
    auto b1 = s.run(rt.accept(from("b", "s1", "b1"))).value();
    // a's first turn and b's run; a's other sessions wait their turn, queued.
    BOOST_TEST_REQUIRE(eventually([&] { return model->calls().size() == 2u; }));
    auto calls = model->calls();
    BOOST_TEST((calls == std::vector<std::string>{"a1", "b1"} || calls == std::vector<std::string>{"b1", "a1"}));
    BOOST_TEST(to_string(s.run(rt.get_turn(a2.turn_id))->status) == "queued");
    BOOST_TEST(s.run(rt.get_session({"a", "s2"}))->queued == 1);
    BOOST_TEST(stats_of(s, "a").running == 1);
    BOOST_TEST(stats_of(s, "a").waiting == 2);
    // b's turn ends without a's moving.
    model->release("b1");
    BOOST_TEST(eventually([&] { return to_string(s.run(rt.get_turn(b1.turn_id))->status) == "completed"; }));
    BOOST_TEST(model->calls().size() == 2u);
    // A waiting turn of a can be cancelled like any queued one; the slot then goes to the next.
    BOOST_TEST(!s.run(rt.cancel(a3.turn_id, "a")).has_value());
    BOOST_TEST(to_string(s.run(rt.get_turn(a3.turn_id))->status) == "stopped");
    model->release("a1");
    BOOST_TEST_REQUIRE(eventually([&] { return model->calls().size() == 3u; }));
    BOOST_TEST(model->calls()[2] == "a2");
    BOOST_TEST(to_string(s.run(rt.get_turn(a1.turn_id))->status) == "completed");
    model->release("a2");
    BOOST_TEST(eventually([&] { return to_string(s.run(rt.get_turn(a2.turn_id))->status) == "completed"; }));
    BOOST_TEST(eventually([&] { return stats_of(s, "a").running == 0; }));
    BOOST_TEST(stats_of(s, "a").waiting == 0);
    // Usage: a's two answered turns (15 tokens each) and the cancelled one.
    auto u = s.run(rt.usage("a"));
    BOOST_TEST(u.today.turns == 3);
    BOOST_TEST(u.today.prompt_tokens == 20);
    BOOST_TEST(u.today.completion_tokens == 10);
    BOOST_TEST(u.days.size() == 30u);
    BOOST_TEST(u.limits.max_running_turns == 1);
    BOOST_TEST(stats_of(s, "a").tokens_today == 30);
    s.stop();
}

BOOST_AUTO_TEST_CASE(tokens_per_day_refuses_new_messages_until_the_next_utc_day) {
    tenant_limits l;
    l.tokens_per_day = 20;
    // 23:59:00 UTC: a minute before the day ends.
    const time_ms day = 20'000LL * 86'400'000;
    clocked_service s(with_limits({{"a", l}}), day + 86'400'000 - 60'000);
    auto model = std::make_shared<held_model>(s.io.get_executor());
    agent_config cfg;
    s.svc->add_agent(cfg, model);
    s.start();
    auto& rt = s.svc->runtime();
    auto keyed = [](accept_request m, std::string key, std::string fingerprint) {
        m.idem = {std::move(key), std::move(fingerprint)};
        return m;
    };
    auto t1 = s.run(rt.accept(keyed(from("a", "s1", "x1"), "k1", "f1"))).value();
    auto t2 = s.run(rt.accept(from("a", "s2", "x2"))).value(); // accepted: nothing spent yet
    BOOST_TEST_REQUIRE(eventually([&] { return model->calls().size() == 2u; }));
    model->release("x1");
    BOOST_TEST(eventually([&] { return stats_of(s, "a").tokens_today == 15; }));
    // 15 of 20 spent: still under the budget.
    auto t3 = s.run(rt.accept(from("a", "s1", "x3")));
    BOOST_TEST(t3.has_value());
    model->release("x2");
    BOOST_TEST(eventually([&] { return stats_of(s, "a").tokens_today == 30; }));
    auto refused = s.run(rt.accept(from("a", "s3", "x4")));
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST((refused.error().code == errc::quota_exceeded));
    BOOST_TEST(refused.error().retry_after_s == 60);
    // A replay of a message accepted before still finds its turn; the key with another request is
    // still a reuse; a key not used before is a new message, refused.
    auto replay = s.run(rt.accept(keyed(from("a", "s1", "x1"), "k1", "f1")));
    BOOST_TEST_REQUIRE(replay.has_value());
    BOOST_TEST(replay->replayed);
    BOOST_TEST(replay->turn_id == t1.turn_id);
    auto reused = s.run(rt.accept(keyed(from("a", "s1", "other"), "k1", "f2")));
    BOOST_TEST_REQUIRE(!reused.has_value());
    BOOST_TEST((reused.error().code == errc::idempotency_key_reused));
    auto fresh = s.run(rt.accept(keyed(from("a", "s1", "x5"), "k2", "f5")));
    BOOST_TEST_REQUIRE(!fresh.has_value());
    BOOST_TEST((fresh.error().code == errc::quota_exceeded));
    // The turn accepted before the budget ran out still runs to its end.
    BOOST_TEST_REQUIRE(eventually([&] { return model->calls().size() == 3u; }));
    model->release("x3");
    BOOST_TEST(eventually([&] { return to_string(s.run(rt.get_turn(t3->turn_id))->status) == "completed"; }));
    BOOST_TEST(stats_of(s, "a").quota_exceeded ==
               2); // x4 and x5; the replay and the reuse are not counted
    // Another tenant is not held by a's budget, nor by its keys.
    BOOST_TEST(!s.run(rt.accept(keyed(from("b", "s9", "x1"), "k1", "f1")))->replayed);
    BOOST_TEST(s.run(rt.accept(from("b", "s1", "y1"))).has_value());
    // A new UTC day: a may talk again.
    s.clock->advance(std::chrono::seconds(60));
    BOOST_TEST(s.run(rt.accept(from("a", "s3", "x4"))).has_value());
    BOOST_TEST(t1.turn_id != t2.turn_id);
    BOOST_TEST_REQUIRE(eventually([&] { return model->calls().size() == 6u; }));
    BOOST_TEST(eventually([&] {
        model->release_all();
        return s.svc->runtime().running_turns() == 0 && s.svc->runtime().queued_turns() == 0;
    }));
    s.stop();
}

BOOST_AUTO_TEST_SUITE_END()
