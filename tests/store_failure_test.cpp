// A store that fails for a while (a full disk, an I/O error that passes), through the embedded
// runtime: the end of a turn is stored at last, and no reader learns an outcome before it is.
// Found by running the daemon on a 3 MB tmpfs: a turn whose end could not be stored read
// "running" for good, while its SSE stream had already said turn.finished.
#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <baton/pipeline.hpp>
#include <baton/runtime.hpp>

#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

using namespace baton;
using namespace baton::test;
using namespace std::chrono_literals;

namespace {

class failing_store final : public delegating_store {
public:
    void finish_turn(const turn_record& t) override {
        ++finish_calls;
        if (failing.load()) throw std::runtime_error("sqlite: COMMIT: database or disk is full");
        inner->finish_turn(t);
    }
    std::atomic<bool> failing{false};
    std::atomic<int> finish_calls{0};
};

struct failing_runtime {
    asio::io_context ctx;
    std::shared_ptr<failing_store> st = std::make_shared<failing_store>();
    store_runner db{st};
    framework fw{db, make_default_plugin(db)};
    runtime rt{ctx.get_executor(), fw};
    std::mutex m;
    std::map<std::string, turn_record> finished;
    asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
    std::thread thread;

    failing_runtime() {
        agent a;
        a.model = make_echo_model();
        fw.add_agent(a);
        rt.on_turn_finished([this](const turn_record& r) {
            std::lock_guard lock(m);
            finished[r.turn_id] = r;
        });
        thread = std::thread([this] { ctx.run(); });
    }
    ~failing_runtime() {
        work.reset();
        ctx.stop();
        thread.join();
        db.stop();
    }
    std::string accept(std::string text) {
        accept_request r;
        r.session_id = "s1";
        r.text = std::move(text);
        auto res = asio::co_spawn(ctx, rt.accept(std::move(r)), asio::use_future).get();
        BOOST_REQUIRE(res.has_value());
        return (*res).turn_id;
    }
    std::optional<turn_record> get(const std::string& tid) {
        return asio::co_spawn(ctx, rt.get_turn(tid), asio::use_future).get();
    }
    bool finished_yet(const std::string& tid) {
        std::lock_guard lock(m);
        return finished.contains(tid);
    }
    template <class Pred> static bool wait_for(Pred p, std::chrono::milliseconds limit = 10s) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        while (!p() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(2ms);
        return p();
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(store_failures)

BOOST_AUTO_TEST_CASE(the_end_of_a_turn_is_stored_at_last_and_published_only_then) {
    failing_runtime f;
    f.st->failing = true;
    auto tid = f.accept("hello");
    // Several attempts fail: the turn still reads running, and its stream has not ended.
    BOOST_REQUIRE(failing_runtime::wait_for([&] { return f.st->finish_calls.load() >= 3; }));
    auto during = f.get(tid);
    BOOST_REQUIRE(during);
    BOOST_TEST((during->status == turn_status::running));
    BOOST_TEST(!f.finished_yet(tid));
    auto log = f.rt.events().find(tid);
    BOOST_REQUIRE(log);
    BOOST_TEST(!log->read_after(0, 1000).finished);

    // The disk has room again: the end is stored, then published.
    f.st->failing = false;
    BOOST_REQUIRE(failing_runtime::wait_for([&] { return f.finished_yet(tid); }));
    auto after = f.get(tid);
    BOOST_REQUIRE(after);
    BOOST_TEST((after->status == turn_status::completed));
    BOOST_TEST(after->reply.value_or("") == "echo: hello");
    auto stored = f.st->inner->get_turn(tid);
    BOOST_REQUIRE(stored);
    BOOST_TEST((stored->status == turn_status::completed));

    // The session goes on.
    auto next = f.accept("again");
    BOOST_REQUIRE(failing_runtime::wait_for([&] { return f.finished_yet(next); }));
    BOOST_TEST((f.get(next)->status == turn_status::completed));
}

BOOST_AUTO_TEST_CASE(a_draining_runtime_gives_up_and_leaves_the_turn_running_in_the_store) {
    failing_runtime f;
    f.st->failing = true;
    auto tid = f.accept("hello");
    BOOST_REQUIRE(failing_runtime::wait_for([&] { return f.st->finish_calls.load() >= 2; }));
    // Shutting down: the next failure ends the attempts; the store keeps the turn running, which
    // the next start ends as abandoned (crash_recovery covers that part).
    auto drained = asio::co_spawn(f.ctx, f.rt.drain(5s), asio::use_future);
    BOOST_REQUIRE(drained.wait_for(10s) == std::future_status::ready);
    BOOST_TEST(f.st->finish_calls.load() >= 3);
    BOOST_TEST(!f.finished_yet(tid)); // nobody is told an end that was never stored
    BOOST_TEST(!f.rt.events().find(tid)->read_after(0, 1000).finished);
    auto stored = f.st->inner->get_turn(tid);
    BOOST_REQUIRE(stored);
    BOOST_TEST((stored->status == turn_status::running));
}

BOOST_AUTO_TEST_SUITE_END()
