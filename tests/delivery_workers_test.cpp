// The delivery workers in process: a runtime on two threads, the memory store and scripted pushing
// channels. Replies are split to the channel's limit and arrive in order per recipient, no more
// sends run at once than the channel allows, and failed attempts follow the retry budget, each retry
// at its backoff on a manual clock and not a millisecond before.
#include "tests/test_util.hpp"

#include <baton/clock.hpp>
#include <baton/pipeline.hpp>
#include <baton/delivery.hpp>
#include <baton/runtime.hpp>
#include <baton/store_runner.hpp>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <map>
#include <mutex>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

// A pushing channel that records what it is asked to send, how many sends overlap (in all and per
// recipient), and answers from a script (default: delivered).
class scripted_channel : public outbound_channel {
public:
    scripted_channel(std::string name, bool ordered, std::size_t concurrency, std::size_t chunk)
        : name_(std::move(name)), ordered_(ordered), concurrency_(concurrency), chunk_(chunk) {}

    std::string_view name() const override { return name_; }
    std::optional<std::string> check_recipient(std::string_view to) const override {
        if (to.starts_with("r")) return std::nullopt;
        return "recipients start with r";
    }
    std::size_t max_chunk_chars() const override { return chunk_; }
    std::size_t max_concurrency() const override { return concurrency_; }
    bool ordered() const override { return ordered_; }

    asio::awaitable<send_outcome> send(const outbox_item& item) override {
        std::function<send_outcome(const outbox_item&)> decide;
        {
            std::lock_guard lock(m);
            sent[item.recipient].push_back(item.text);
            max_active = std::max(max_active, ++active);
            max_per_recipient = std::max(max_per_recipient, ++active_for[item.recipient]);
            decide = script;
        }
        struct count_end {
            std::atomic<int>& n;
            ~count_end() { ++n; }
        } end{ended};
        asio::steady_timer t(co_await asio::this_coro::executor, delay);
        co_await t.async_wait(asio::use_awaitable); // cancellation (a stop past its grace) throws
        auto outcome = decide ? decide(item) : send_outcome::ok();
        std::lock_guard lock(m);
        --active;
        --active_for[item.recipient];
        ++done;
        return_keys.push_back(item.key);
        co_return outcome;
    }

    std::mutex m;
    std::map<std::string, std::vector<std::string>> sent; // recipient -> texts, in send order
    std::map<std::string, int> active_for;
    int active = 0, max_active = 0, max_per_recipient = 0;
    std::size_t done = 0;
    std::vector<std::string> return_keys;
    std::function<send_outcome(const outbox_item&)> script;
    std::chrono::milliseconds delay{5}; // how long a send takes; set before the first
    std::atomic<int> ended{0};          // sends over, however they ended

private:
    std::string name_;
    bool ordered_;
    std::size_t concurrency_, chunk_;
};

struct delivery_fixture {
    asio::io_context ctx;
    store_runner db{std::shared_ptr<store>(make_memory_store())};
    framework fw{db, make_default_plugin(db)};
    runtime rt{ctx.get_executor(), fw};
    std::shared_ptr<scripted_channel> chat = std::make_shared<scripted_channel>("chat", true, 2, 10);
    std::shared_ptr<scripted_channel> bulk = std::make_shared<scripted_channel>("bulk", false, 3, 0);
    // The backoffs' clock: retries wait until the test moves it.
    std::shared_ptr<manual_clock> clock = std::make_shared<manual_clock>();
    delivery out;
    asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
    std::vector<std::thread> threads;

    delivery_options two_retries() {
        delivery_options o;
        o.retry.backoff = {std::chrono::seconds(1), std::chrono::seconds(5)};
        o.clock = clock;
        return o;
    }

    delivery_fixture() : out(ctx.get_executor(), rt, two_retries()) {
        agent a;
        a.model = make_echo_model();
        fw.add_agent(a);
        out.add_channel(chat);
        out.add_channel(bulk);
        fw.register_plugin(out.make_plugin());
        for (int i = 0; i < 2; ++i)
            threads.emplace_back([this] { ctx.run(); });
        asio::co_spawn(ctx, out.start(), asio::use_future).get();
    }
    ~delivery_fixture() {
        asio::co_spawn(ctx, out.stop(std::chrono::seconds(2)), asio::use_future).get();
        work.reset();
        ctx.stop();
        for (auto& t : threads)
            t.join();
        db.stop();
    }

    accept_result accept(std::string sid, std::string text, std::string channel, std::string to) {
        accept_request r;
        r.session_id = std::move(sid);
        r.text = std::move(text);
        r.deliver = json::object{{"channel", std::move(channel)}, {"to", std::move(to)}};
        return asio::co_spawn(ctx, rt.accept(std::move(r)), asio::use_future).get();
    }

    std::vector<outbox_item> items(outbox_status s) {
        store::outbox_filter f;
        f.statuses = {s};
        return asio::co_spawn(ctx, rt.list_outbox(f), asio::use_future).get();
    }

    // Polls until `n` items have `s` (bounded).
    bool wait_items(outbox_status s, std::size_t n, std::chrono::milliseconds limit = 10s) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < deadline) {
            if (items(s).size() >= n) return true;
            std::this_thread::sleep_for(5ms);
        }
        return false;
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(delivery_workers)

BOOST_AUTO_TEST_CASE(long_replies_arrive_in_order_per_recipient_within_the_concurrency_bound) {
    delivery_fixture f;
    // echo: "echo: " + text, cut into chunks of at most 10 characters.
    const std::string text = "one two three four five six seven eight";
    for (int i = 0; i < 3; ++i)
        BOOST_TEST_REQUIRE((f.accept("chat-" + std::to_string(i), text, "chat", "r" + std::to_string(i))).has_value());
    const std::string reply = "echo: " + text;
    auto chunks = split_chunks(reply, 10).size();
    BOOST_TEST(chunks >= 5u);
    BOOST_TEST_REQUIRE(f.wait_items(outbox_status::delivered, 3 * chunks));
    std::lock_guard lock(f.chat->m);
    for (int i = 0; i < 3; ++i) {
        const auto& got = f.chat->sent["r" + std::to_string(i)];
        BOOST_TEST(got.size() == chunks);
        std::string joined;
        for (const auto& c : got)
            joined += c;
        BOOST_TEST(joined == reply);
    }
    BOOST_TEST(f.chat->max_active <= 2);
    BOOST_TEST(f.chat->max_per_recipient == 1);
}

BOOST_AUTO_TEST_CASE(an_unordered_channel_sends_in_parallel_up_to_its_bound) {
    delivery_fixture f;
    for (int i = 0; i < 12; ++i)
        BOOST_TEST_REQUIRE((f.accept("bulk-" + std::to_string(i), "x", "bulk", "r-all")).has_value());
    BOOST_TEST_REQUIRE(f.wait_items(outbox_status::delivered, 12));
    std::lock_guard lock(f.bulk->m);
    BOOST_TEST(f.bulk->max_active <= 3);
    BOOST_TEST(f.bulk->max_active >= 2); // one recipient does not serialise an unordered channel
}

// A send still in flight when the stop's grace runs out is cancelled, not left running past the
// stop: the item stays `sending` (uncertain at the next start).
BOOST_AUTO_TEST_CASE(a_send_past_the_stop_grace_is_cancelled_and_left_sending) {
    delivery_fixture f;
    f.bulk->delay = std::chrono::minutes(10);
    BOOST_TEST_REQUIRE((f.accept("slow", "x", "bulk", "r1")).has_value());
    BOOST_TEST_REQUIRE(f.wait_items(outbox_status::sending, 1));
    auto t0 = std::chrono::steady_clock::now();
    auto stopped = asio::co_spawn(f.ctx, f.out.stop(std::chrono::milliseconds(100)), asio::use_future);
    BOOST_TEST_REQUIRE((stopped.wait_for(10s) == std::future_status::ready));
    stopped.get();
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));
    BOOST_TEST(f.bulk->ended.load() == 1); // unwound before the stop completed
    BOOST_TEST(f.items(outbox_status::sending).size() == 1u);
    std::lock_guard lock(f.bulk->m);
    BOOST_TEST(f.bulk->done == 0u);
}

BOOST_AUTO_TEST_CASE(retries_follow_the_budget_then_fail) {
    using std::chrono::milliseconds;
    delivery_fixture f;
    f.bulk->script = [](const outbox_item& item) {
        if (item.session_id == "flaky" && item.attempts < 2) return send_outcome::again("busy");
        if (item.session_id == "broken") return send_outcome::again("down");
        return send_outcome::ok();
    };
    BOOST_TEST_REQUIRE((f.accept("flaky", "x", "bulk", "r1")).has_value());
    BOOST_TEST_REQUIRE((f.accept("broken", "x", "bulk", "r1")).has_value());
    // Each pending item after `attempts` attempts, once the lane waits for the next one.
    auto waiting_after = [&](std::size_t n, std::int64_t attempts) {
        return eventually([&] {
            auto items = f.items(outbox_status::pending);
            bool all = items.size() == n;
            for (const auto& i : items)
                all = all && i.attempts == attempts && i.status == outbox_status::pending;
            return all && f.clock->waiting() == 1;
        });
    };
    // Both first attempts fail at once; the next waits the first backoff, 1 s.
    BOOST_TEST_REQUIRE(waiting_after(2, 1));
    for (const auto& i : f.items(outbox_status::pending))
        BOOST_TEST(i.next_attempt_at == f.clock->utc_ms() + 1000);
    f.clock->advance(milliseconds(999));
    BOOST_TEST_REQUIRE(waiting_after(2, 1));
    f.clock->advance(milliseconds(1));
    BOOST_TEST_REQUIRE(f.wait_items(outbox_status::delivered, 1));
    // The second failure of `broken` waits the second backoff, 5 s; its third is the last.
    BOOST_TEST_REQUIRE(waiting_after(1, 2));
    BOOST_TEST(f.items(outbox_status::pending).at(0).next_attempt_at == f.clock->utc_ms() + 5000);
    f.clock->advance(milliseconds(4999));
    BOOST_TEST_REQUIRE(waiting_after(1, 2));
    f.clock->advance(milliseconds(1));
    BOOST_TEST_REQUIRE(f.wait_items(outbox_status::failed, 1));
    auto ok = f.items(outbox_status::delivered).at(0);
    BOOST_TEST(ok.session_id == "flaky");
    BOOST_TEST(ok.attempts == 2);
    auto failed = f.items(outbox_status::failed).at(0);
    BOOST_TEST(failed.session_id == "broken");
    BOOST_TEST(failed.attempts == 3); // two backoffs in this budget, then the last attempt
    BOOST_TEST(failed.last_error == "down");
    BOOST_TEST(f.items(outbox_status::pending).empty());
    std::lock_guard lock(f.bulk->m);
    BOOST_TEST(f.bulk->done == 5u); // 2 + 1 + 2 attempts: none early, none extra
}

BOOST_AUTO_TEST_CASE(unknown_recipients_are_refused_at_accept) {
    delivery_fixture f;
    auto r = f.accept("s", "x", "chat", "nobody");
    BOOST_TEST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error().message.find("recipients start with r") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
