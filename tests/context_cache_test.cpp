// The context window kept between turns (pipeline/context_cache): what enters a window, that it
// survives turns without store reads, and that it is rebuilt from the store when it cannot be
// trusted. I/O-free except the last case, which runs turns through the framework.
#include "pipeline/context_cache.hpp"

#include <baton/framework.hpp>

#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>

using namespace baton;
using namespace baton::test;
using baton::pipeline::context_cache;
using baton::pipeline::context_window;

namespace {

tape_entry anchor(std::string_view summary) {
    return make_entry(tape_kind::anchor, {{"name", "a"}, {"summary", summary}});
}

std::vector<std::string> texts(const std::vector<chat_message>& m) {
    std::vector<std::string> out;
    for (const auto& x : m)
        out.push_back(x.role + ":" + x.content);
    return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(context_cache_suite)

BOOST_AUTO_TEST_CASE(window_keeps_messages_since_the_last_anchor_up_to_its_cap) {
    context_window w;
    w.add(make_message("user", "old"), 3);
    w.add(anchor(""), 3);
    BOOST_TEST(w.messages.empty());
    BOOST_TEST(w.bytes == 0u);
    w.add(make_message("user", "a"), 3);
    w.add(make_entry(tape_kind::tool_call, {{"call_id", "c"}, {"name", "clock"}}), 3);
    w.add(make_message("assistant", "b"), 3);
    w.add(make_message("user", "c"), 3);
    w.add(make_message("assistant", "d"), 3);
    std::vector<chat_message> got(w.messages.begin(), w.messages.end());
    BOOST_TEST(texts(got) == (std::vector<std::string>{"assistant:b", "user:c", "assistant:d"}),
               boost::test_tools::per_element());
    w.add(anchor("we spoke of c"), 3);
    BOOST_REQUIRE(w.messages.size() == 1u);
    BOOST_TEST(w.messages.front().role == "system");
    BOOST_TEST(w.messages.front().content == "we spoke of c");
}

BOOST_AUTO_TEST_CASE(cache_extends_a_cached_session_and_forgets_on_erase) {
    context_cache cache(64);
    json::object state;
    std::vector<chat_message> window;
    BOOST_TEST(!cache.get("s1", state, window));
    // Not cached: apply does nothing (the next turn loads from the store).
    cache.apply("s1", {make_message("user", "lost")}, {});
    BOOST_TEST(!cache.get("s1", state, window));

    cache.put("s1", {{"k", 1}},
              cache.render({make_message("user", "hi"), make_message("assistant", "hello")}));
    cache.apply("s1", {make_message("user", "again")}, {{"k", 2}});
    BOOST_REQUIRE(cache.get("s1", state, window));
    BOOST_TEST(texts(window) == (std::vector<std::string>{"user:hi", "assistant:hello", "user:again"}),
               boost::test_tools::per_element());
    BOOST_TEST(state.at("k").as_int64() == 2);
    cache.erase("s1");
    BOOST_TEST(!cache.get("s1", state, window));
}

BOOST_AUTO_TEST_CASE(cache_stays_within_its_byte_budget) {
    context_cache cache(64, 16 * 4096); // 4 KiB per shard
    for (int i = 0; i < 2000; ++i)
        cache.put("s" + std::to_string(i), {},
                  cache.render({make_message("user", std::string(500, 'x'))}));
    // Each session costs over 500 bytes: far fewer than 2000 fit in 64 KiB.
    BOOST_TEST(cache.sessions() < 200u);
    BOOST_TEST(cache.sessions() > 16u);
}

namespace {
// A memory store that counts tape reads and can fail the next save.
class watched_store final : public delegating_store {
public:
    void save_state(state_update& u) override {
        if (fail_next_save.exchange(false)) throw std::runtime_error("disk full");
        inner->save_state(u);
    }
    std::vector<tape_entry> tape_tail(const std::string& s, std::size_t l) override {
        ++tail_reads;
        return inner->tape_tail(s, l);
    }
    std::atomic<bool> fail_next_save{false};
    std::atomic<int> tail_reads{0};
};

struct echo_last final : model_client {
    std::vector<std::size_t> prompt_sizes;
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        prompt_sizes.push_back(req.messages.size());
        chat_completion c;
        c.text = "re: " + req.messages.back().content;
        co_return c;
    }
    std::string name() const override { return "echo_last"; }
};
} // namespace

BOOST_AUTO_TEST_CASE(window_survives_turns_and_is_reloaded_after_a_failed_save) {
    io_fixture f;
    auto st = std::make_shared<watched_store>();
    store_runner db{st};
    framework fw(db);
    auto model = std::make_shared<echo_last>();
    agent a;
    a.model = model;
    fw.add_agent(a);
    auto turn = [&](std::string text) -> asio::awaitable<void> {
        inbound in;
        in.session_id = "s1";
        in.text = std::move(text);
        co_await fw.process_inbound(std::move(in));
    };
    run_bounded(f.ctx, turn("one"));
    run_bounded(f.ctx, turn("two"));
    run_bounded(f.ctx, turn("three"));
    // Only the first turn read the tape; the next ones used the cached window.
    BOOST_TEST(st->tail_reads.load() == 1);
    st->fail_next_save = true;
    BOOST_CHECK_THROW(run_bounded(f.ctx, turn("lost")), std::runtime_error);
    run_bounded(f.ctx, turn("four"));
    // After the failed save the window came from the store again, without the lost turn.
    BOOST_TEST(st->tail_reads.load() == 2);
    BOOST_TEST(model->prompt_sizes == (std::vector<std::size_t>{1, 3, 5, 7, 7}),
               boost::test_tools::per_element());
    BOOST_TEST(st->read_tape("s1", 0, 100).size() == 8u);
}

BOOST_AUTO_TEST_SUITE_END()
