// Group commit (store_runner): calls queued while the store thread is busy share one transaction;
// a failing call is undone alone (its batch, run bare first, is rolled back and run again call by
// call); a call run_once never runs twice; a failed commit fails every call of its batch.
#include <baton/store_runner.hpp>

#include "tests/daemon_fixture.hpp"
#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>

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

// A call for store_runner::run_once rather than run.
template <class F> struct once { F f; };
template <class F> once(F) -> once<F>;

template <class T> struct is_once : std::false_type {};
template <class F> struct is_once<once<F>> : std::true_type {};

// Runs one call through the runner (run_once for a once{...}), keeping what it threw.
template <class Call>
asio::awaitable<void> run_one(store_runner& db, Call call, std::exception_ptr& error,
                              std::atomic<int>& done) {
    try {
        if constexpr (is_once<Call>::value)
            co_await db.run_once(std::move(call.f));
        else
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

// Holds the store thread in a call of its own until `spawn` has queued its n calls (spawn(errors,
// done) co_spawns them), so that all of them go into the next batch together.
template <class Spawn>
std::vector<std::exception_ptr> in_one_batch(asio::io_context& ctx, store_runner& db, int n,
                                             Spawn spawn) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::atomic<int> done{0};
    std::exception_ptr gate_error;
    std::mutex m;
    std::condition_variable cv;
    bool open = false;
    std::atomic<bool> entered{false};
    auto gate = [&](store&) {
        entered = true;
        std::unique_lock lock(m);
        cv.wait_for(lock, 10s, [&] { return open; });
    };
    asio::co_spawn(ctx, run_one(db, gate, gate_error, done), asio::detached);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!entered.load() && std::chrono::steady_clock::now() < deadline)
        ctx.run_one_for(10ms);
    BOOST_REQUIRE(entered.load());
    spawn(errors, done);
    while (ctx.poll() > 0) {
    } // every call has run up to its submission
    {
        std::lock_guard lock(m);
        open = true;
    }
    cv.notify_one();
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
        BOOST_TEST(db.replays() == 0u); // no call failed: every batch went through bare
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
        // The bare batch was rolled back at the first failure and run again call by call.
        BOOST_TEST(db.replays() >= 1u);
        db.stop();
    }
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 20u);
    BOOST_TEST(again->get_session("s0")->turns == 1);
    BOOST_TEST(!again->get_session("s_fail").has_value());
}

// The calls of one batch: counted() counts its runs and inserts t_keep, failing() inserts a
// duplicate of t_keep after creating session s_fail, plain(i) inserts t_i.
struct counted_batch {
    std::atomic<int> runs{0};
    auto plain(int i) {
        auto t = queued_turn("t_" + std::to_string(i), "s" + std::to_string(i));
        return [t](store& s) { s.insert_turn(t, {}); };
    }
    auto counted() {
        return [this](store& s) {
            ++runs;
            s.insert_turn(queued_turn("t_keep", "s0"), {});
        };
    }
    auto failing() {
        return [](store& s) { s.insert_turn(queued_turn("t_keep", "s_fail"), {}); };
    }
};

// One batch of ten behind the gate: `first` (counted, via run or run_once), eight plain calls,
// then the failing one, which alone must fail. Returns the runner's batches and replays.
struct batch_outcome {
    std::uint64_t batches = 0, replays = 0;
};
template <class First>
batch_outcome run_counted_batch(const std::string& path, counted_batch& b, First first) {
    io_fixture f;
    store_runner db(std::shared_ptr<store>(make_sqlite_store({path})));
    const int n = 10;
    auto errors = in_one_batch(f.ctx, db, n, [&](auto& errs, auto& done) {
        asio::co_spawn(f.ctx, run_one(db, first, errs[0], done), asio::detached);
        for (int i = 1; i < n - 1; ++i)
            asio::co_spawn(f.ctx, run_one(db, b.plain(i), errs[static_cast<std::size_t>(i)], done),
                           asio::detached);
        asio::co_spawn(f.ctx, run_one(db, b.failing(), errs.back(), done), asio::detached);
    });
    for (int i = 0; i < n; ++i)
        BOOST_TEST(static_cast<bool>(errors[static_cast<std::size_t>(i)]) == (i == n - 1));
    batch_outcome out{db.batches(), db.replays()};
    db.stop();
    return out;
}

BOOST_AUTO_TEST_CASE(a_batch_with_a_failing_call_runs_every_call_again) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    counted_batch b;
    auto out = run_counted_batch(path, b, b.counted());
    BOOST_TEST(out.batches == 2u); // the gate's, then all ten together
    BOOST_TEST(out.replays == 1u);
    // Run bare, rolled back, run again: twice, and its turn is stored once.
    BOOST_TEST(b.runs.load() == 2);
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 9u);
    BOOST_TEST(again->get_turn("t_keep")->session_id == "s0");
    BOOST_TEST(!again->get_session("s_fail").has_value());
}

BOOST_AUTO_TEST_CASE(a_call_run_once_is_never_run_again) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    counted_batch b;
    auto out = run_counted_batch(path, b, once{b.counted()});
    BOOST_TEST(out.batches == 2u);
    BOOST_TEST(out.replays == 0u); // its batch ran call by call from the start
    BOOST_TEST(b.runs.load() == 1);
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 9u);
    BOOST_TEST(again->get_turn("t_keep").has_value());
    BOOST_TEST(!again->get_session("s_fail").has_value());
}

BOOST_AUTO_TEST_CASE(a_call_that_fails_before_writing_needs_no_second_run) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    counted_batch b;
    std::uint64_t replays = 0;
    {
        io_fixture f;
        store_runner db(std::shared_ptr<store>(make_sqlite_store({path})));
        const int n = 5;
        auto unknown = [](store& s) {
            auto t = queued_turn("t_unknown", "s1");
            t.status = turn_status::completed;
            s.finish_turn(t); // changes no row, then throws
        };
        auto errors = in_one_batch(f.ctx, db, n, [&](auto& errs, auto& done) {
            asio::co_spawn(f.ctx, run_one(db, b.counted(), errs[0], done), asio::detached);
            asio::co_spawn(f.ctx, run_one(db, unknown, errs[1], done), asio::detached);
            for (int i = 2; i < n; ++i)
                asio::co_spawn(f.ctx, run_one(db, b.plain(i), errs[static_cast<std::size_t>(i)], done),
                               asio::detached);
        });
        for (int i = 0; i < n; ++i)
            BOOST_TEST(static_cast<bool>(errors[static_cast<std::size_t>(i)]) == (i == 1));
        replays = db.replays();
        db.stop();
    }
    BOOST_TEST(replays == 0u);
    BOOST_TEST(b.runs.load() == 1);
    auto again = make_sqlite_store({path});
    BOOST_TEST(again->unfinished_turns().size() == 4u);
}

// The store's side of it, called directly: an optimistic batch in which a call failed is not
// committed, and abort_batch() leaves the store ready for the next batch.
BOOST_AUTO_TEST_CASE(an_optimistic_batch_with_a_failed_call_stores_nothing) {
    scratch_dir dir;
    auto path = (dir.root / "baton.db").string();
    auto s = make_sqlite_store({path});
    BOOST_REQUIRE(s->begin_optimistic_batch());
    s->insert_turn(queued_turn("t_1", "s1"), {});
    BOOST_CHECK_THROW(s->insert_turn(queued_turn("t_1", "s_fail"), {}), std::runtime_error);
    // A later call of the tainted batch refuses to run, and so does the commit.
    BOOST_CHECK_THROW(s->insert_turn(queued_turn("t_2", "s2"), {}), std::runtime_error);
    BOOST_CHECK_THROW(s->end_batch(), std::runtime_error);
    BOOST_TEST(!s->get_turn("t_1").has_value());
    BOOST_TEST(!s->get_session("s_fail").has_value());
    // The same again, but abort_batch() then a plain batch: the store goes on.
    BOOST_REQUIRE(s->begin_optimistic_batch());
    s->insert_turn(queued_turn("t_1", "s1"), {});
    s->abort_batch();
    s->begin_batch();
    s->insert_turn(queued_turn("t_3", "s3"), {});
    s->end_batch();
    s.reset(); // one store at a time on a database
    auto again = make_sqlite_store({path});
    BOOST_TEST(!again->get_turn("t_1").has_value());
    BOOST_TEST(again->get_turn("t_3").has_value());
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
