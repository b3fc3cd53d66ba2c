// Group commit (store_runner): calls queued while the store thread is busy share one transaction;
// a failing call is undone alone; a failed commit fails every call of its batch.
#include <baton/store_runner.hpp>

#include "tests/daemon_fixture.hpp"
#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

turn_record queued_turn(const std::string& tid, const std::string& sid) {
    turn_record t;
    t.turn_id = tid;
    t.session_id = sid;
    t.created_at = now_ms();
    t.input.text = "hello " + tid;
    return t;
}

// A memory store that claims to block (so the runner batches) and can fail its commit.
class failing_commit_store final : public delegating_store {
public:
    bool blocking() const override { return true; }
    void end_batch() override {
        if (fail_commits) throw std::runtime_error("disk full");
    }
    std::atomic<bool> fail_commits{false};
};

template <class Call>
asio::awaitable<void> run_one(store_runner& db, Call call, std::exception_ptr& error,
                              std::atomic<int>& done) {
    try {
        co_await db.run(std::move(call));
    } catch (...) {
        error = std::current_exception();
    }
    ++done;
}

// Submits `n` calls while the store thread is held by a slow first call, so that they queue up.
template <class Make>
std::vector<std::exception_ptr> queue_behind_slow_call(asio::io_context& ctx, store_runner& db, int n,
                                                       Make make_call) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::atomic<int> done{0};
    std::exception_ptr slow_error;
    auto slow = [](store&) { std::this_thread::sleep_for(200ms); };
    // Spawned first, so it reaches the store thread first; the others queue while it sleeps.
    asio::co_spawn(ctx, run_one(db, slow, slow_error, done), asio::detached);
    for (int i = 0; i < n; ++i)
        asio::co_spawn(ctx, run_one(db, make_call(i), errors[static_cast<std::size_t>(i)], done),
                       asio::detached);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    ctx.restart();
    while (done.load() < n + 1 && std::chrono::steady_clock::now() < deadline)
        ctx.run_one_for(10ms);
    BOOST_REQUIRE_EQUAL(done.load(), n + 1);
    return errors;
}

} // namespace

BOOST_AUTO_TEST_SUITE(group_commit)

BOOST_AUTO_TEST_CASE(calls_queued_meanwhile_share_one_commit_and_are_durable) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    {
        io_fixture f;
        store_runner db(std::shared_ptr<store>(make_sqlite_store({path})));
        auto insert = [](int i) {
            return [i](store& s) { s.insert_turn(queued_turn("t_" + std::to_string(i), "s1"), {}); };
        };
        auto errors = queue_behind_slow_call(f.ctx, db, 50, insert);
        for (auto& e : errors)
            BOOST_TEST(!e);
        BOOST_TEST(db.calls() == 51u);
        // The slow call alone, then the 50 that queued behind it (at most split once).
        BOOST_TEST(db.batches() <= 3u);
        db.stop();
    }
    // A fresh connection sees every call: the batch was committed.
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 50u);
    BOOST_TEST(again->get_session("s1")->turns == 50);
}

BOOST_AUTO_TEST_CASE(a_failing_call_is_undone_alone) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    {
        io_fixture f;
        store_runner db(std::shared_ptr<store>(make_sqlite_store({path})));
        auto call = [](int i) {
            // Every third call inserts a duplicate of t_0 (queued earlier in the same batch): it
            // creates session s_fail, then fails on the turn row. All of it must be undone.
            auto t = i % 3 == 1 ? queued_turn("t_0", "s_fail")
                                : queued_turn("t_" + std::to_string(i), "s" + std::to_string(i));
            return [t](store& s) { s.insert_turn(t, {}); };
        };
        auto errors = queue_behind_slow_call(f.ctx, db, 30, call);
        for (std::size_t i = 0; i < errors.size(); ++i)
            BOOST_TEST(static_cast<bool>(errors[i]) == (i % 3 == 1));
        db.stop();
    }
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 20u);
    BOOST_TEST(again->get_session("s0")->turns == 1);
    BOOST_TEST(!again->get_session("s_fail").has_value());
}

BOOST_AUTO_TEST_CASE(a_failed_commit_fails_every_call_of_the_batch) {
    io_fixture f;
    auto st = std::make_shared<failing_commit_store>();
    store_runner db(st);
    st->fail_commits = true;
    auto insert = [](int i) {
        return [i](store& s) { s.insert_turn(queued_turn("t_" + std::to_string(i), "s1"), {}); };
    };
    auto errors = queue_behind_slow_call(f.ctx, db, 10, insert);
    for (auto& e : errors) {
        BOOST_REQUIRE(e);
        BOOST_CHECK_EXCEPTION(
            std::rethrow_exception(e), std::runtime_error,
            [](const std::runtime_error& r) { return std::string(r.what()) == "disk full"; });
    }
    // The runner goes on: the next batch commits.
    st->fail_commits = false;
    auto ok = [](store& s) { return s.insert_turn(queued_turn("t_after", "s1"), {}).turn_id; };
    auto call = [&db, ok]() -> asio::awaitable<std::string> { co_return co_await db.run(ok); };
    BOOST_TEST(run_bounded(f.ctx, call()) == "t_after");
    db.stop();
}

BOOST_AUTO_TEST_SUITE_END()
