// Admission through the embedded runtime: one turn at a time per session in accept order,
// sessions in parallel, bounded queues and the reject mode.
#include "tests/delegating_store.hpp"
#include "tests/test_util.hpp"

#include <baton/pipeline.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

// A run_model hook that takes `delay` of timer time and records, per session, the order of turns
// and the most turns that ever overlapped.
struct recorder {
    std::mutex m;
    std::map<std::string, std::vector<std::string>> order; // session -> texts in run order
    std::map<std::string, int> active, max_active;
    std::chrono::milliseconds delay{0};
    std::map<std::string, std::chrono::milliseconds> delay_for; // text -> delay override

    plugin make() {
        plugin p;
        p.name = "recorder";
        p.run_model = [this](turn_context& ctx,
                             const prompt&) -> asio::awaitable<std::optional<model_output>> {
            auto wait = delay;
            {
                std::lock_guard lock(m);
                order[ctx.session_id].push_back(ctx.inbound.text);
                int now = ++active[ctx.session_id];
                max_active[ctx.session_id] = std::max(max_active[ctx.session_id], now);
                if (auto it = delay_for.find(ctx.inbound.text); it != delay_for.end()) wait = it->second;
            }
            if (wait.count() > 0) {
                asio::steady_timer t(co_await asio::this_coro::executor, wait);
                co_await t.async_wait(asio::use_awaitable);
            }
            {
                std::lock_guard lock(m);
                --active[ctx.session_id];
            }
            co_return std::nullopt; // the default echo runs next
        };
        return p;
    }
};

// A runtime on an io_context run by two threads, as the daemon runs it.
struct runtime_fixture {
    asio::io_context ctx;
    std::filesystem::path dir;
    std::shared_ptr<store> st;
    store_runner db;
    framework fw{db, make_default_plugin(db)};
    recorder rec;
    runtime rt{ctx.get_executor(), fw};
    std::mutex finished_mutex;
    std::map<std::string, turn_record> finished;
    asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
    std::vector<std::thread> threads;

    static std::shared_ptr<store> make_store(const std::filesystem::path& d) {
        std::filesystem::create_directories(d);
        return make_sqlite_store({(d / "baton.db").string(), "normal"});
    }

    explicit runtime_fixture(admission_config adm = {})
        : dir(std::filesystem::temp_directory_path() / ("baton-adm-" + make_turn_id())),
          st(make_store(dir)), db(st) {
        agent a;
        a.config.admission = adm;
        a.model = make_echo_model();
        fw.add_agent(a);
        fw.register_plugin(rec.make());
        rt.on_turn_finished([this](const turn_record& r) {
            std::lock_guard lock(finished_mutex);
            finished[r.turn_id] = r;
        });
        for (int i = 0; i < 2; ++i)
            threads.emplace_back([this] { ctx.run(); });
    }
    ~runtime_fixture() {
        work.reset();
        ctx.stop();
        for (auto& t : threads)
            t.join();
        db.stop();
        std::filesystem::remove_all(dir);
    }

    accept_result accept(std::string sid, std::string text) {
        accept_request r;
        r.session_id = std::move(sid);
        r.text = std::move(text);
        return asio::co_spawn(ctx, rt.accept(std::move(r)), asio::use_future).get();
    }

    std::size_t finished_count() {
        std::lock_guard lock(finished_mutex);
        return finished.size();
    }

    bool wait_finished(std::size_t n, std::chrono::milliseconds limit = 20s) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        while (finished_count() < n && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(2ms);
        return finished_count() >= n;
    }
};

} // namespace

BOOST_AUTO_TEST_SUITE(admission)

BOOST_AUTO_TEST_CASE(one_session_runs_turns_one_at_a_time_in_accept_order_while_others_progress) {
    runtime_fixture f({admission_mode::queue, 128});
    f.rec.delay = 1ms;
    // 100 messages to one session sent concurrently, and 100 other sessions at the same time.
    std::vector<std::future<accept_result>> one, others;
    asio::strand<asio::io_context::executor_type> client(f.ctx.get_executor());
    for (int i = 0; i < 100; ++i) {
        accept_request r;
        r.session_id = "one";
        r.text = "m" + std::to_string(i);
        one.push_back(asio::co_spawn(client, f.rt.accept(std::move(r)), asio::use_future));
        accept_request o;
        o.session_id = "other-" + std::to_string(i);
        o.text = "x";
        others.push_back(asio::co_spawn(f.ctx, f.rt.accept(std::move(o)), asio::use_future));
    }
    for (auto& fut : one)
        BOOST_REQUIRE((fut.get()).has_value());
    for (auto& fut : others)
        BOOST_REQUIRE((fut.get()).has_value());
    BOOST_REQUIRE(f.wait_finished(200));

    std::lock_guard lock(f.rec.m);
    auto& seen = f.rec.order["one"];
    BOOST_REQUIRE_EQUAL(seen.size(), 100u);
    for (int i = 0; i < 100; ++i)
        BOOST_TEST(seen[i] == "m" + std::to_string(i));
    BOOST_TEST(f.rec.max_active["one"] == 1);
    for (int i = 0; i < 100; ++i)
        BOOST_TEST(f.rec.order["other-" + std::to_string(i)].size() == 1u);
    for (auto& [id, r] : f.finished)
        BOOST_TEST((r.status == turn_status::completed));
}

// A channel is told a message is stored (accept_request::on_stored) before anything of its turn
// happens: before turn.queued, before the turn starts.
BOOST_AUTO_TEST_CASE(the_channel_hears_of_a_stored_message_before_its_turn_does_anything) {
    runtime_fixture f;
    std::mutex m;
    std::vector<std::string> order;
    auto id = f.rt.events().listen("told", [&](const turn_log&, const event_ptr& e) {
        std::lock_guard lock(m);
        order.push_back(e->type);
    });
    std::vector<std::string> turn_ids;
    for (int i = 0; i < 20; ++i) {
        accept_request r;
        r.session_id = "told";
        r.text = "m" + std::to_string(i);
        r.on_stored = [&](const accepted& ok) {
            std::lock_guard lock(m);
            order.push_back("stored");
            turn_ids.push_back(ok.turn_id);
        };
        auto res = asio::co_spawn(f.ctx, f.rt.accept(std::move(r)), asio::use_future).get();
        BOOST_TEST_REQUIRE(res.has_value());
        BOOST_TEST((*res).turn_id == turn_ids.back());
    }
    BOOST_REQUIRE(f.wait_finished(20));
    f.rt.events().unlisten("told", id);
    std::lock_guard lock(m);
    // Each turn: "stored", then its events (turn.queued first); turns may interleave after that,
    // but no turn's event comes before its own "stored".
    std::size_t stored = 0, queued = 0;
    for (const auto& e : order) {
        if (e == "stored") ++stored;
        if (e == "turn.queued") BOOST_TEST_REQUIRE(++queued <= stored);
    }
    BOOST_TEST(stored == 20u);
    BOOST_TEST(queued == 20u);
    BOOST_TEST(order.front() == "stored");
}

BOOST_AUTO_TEST_CASE(sessions_run_in_parallel) {
    runtime_fixture f;
    f.rec.delay = 200ms;
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 50; ++i)
        BOOST_REQUIRE((f.accept("p" + std::to_string(i), "x")).has_value());
    BOOST_REQUIRE(f.wait_finished(50));
    // 50 turns of 200 ms each, one after another, would take 10 s.
    BOOST_TEST((std::chrono::steady_clock::now() - start < 5s));
}

BOOST_AUTO_TEST_CASE(a_slow_turn_never_delays_another_session) {
    runtime_fixture f;
    f.rec.delay_for["slow"] = 5s;
    auto slow = (*(f.accept("slow-session", "slow")));
    auto fast = (*(f.accept("fast-session", "fast")));
    auto deadline = std::chrono::steady_clock::now() + 4s;
    bool fast_done = false;
    while (!fast_done && std::chrono::steady_clock::now() < deadline) {
        {
            std::lock_guard lock(f.finished_mutex);
            fast_done = f.finished.count(fast.turn_id) > 0;
        }
        std::this_thread::sleep_for(2ms);
    }
    BOOST_TEST(fast_done);
    std::lock_guard lock(f.finished_mutex);
    BOOST_TEST(f.finished.count(slow.turn_id) == 0u); // still running
}

BOOST_AUTO_TEST_CASE(a_full_queue_answers_session_queue_full) {
    runtime_fixture f({admission_mode::queue, 2});
    f.rec.delay_for["block"] = 500ms;
    BOOST_REQUIRE((f.accept("q", "block")).has_value());
    // Let the first turn start so that the next ones wait.
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (f.rt.running_turns() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    BOOST_REQUIRE((f.accept("q", "a")).has_value());
    BOOST_REQUIRE((f.accept("q", "b")).has_value());
    auto third = f.accept("q", "c");
    BOOST_REQUIRE(!third.has_value());
    BOOST_TEST((third.error().code == errc::session_queue_full));
    auto view = asio::co_spawn(f.ctx, f.rt.get_session("q"), asio::use_future).get();
    BOOST_REQUIRE(view);
    BOOST_TEST(view->busy);
    BOOST_TEST(view->queued == 2);
    BOOST_REQUIRE(f.wait_finished(3));
    // Idle actors are evicted; their state lives in the store.
    deadline = std::chrono::steady_clock::now() + 5s;
    while (f.rt.live_sessions() != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    BOOST_TEST(f.rt.live_sessions() == 0u);
    view = asio::co_spawn(f.ctx, f.rt.get_session("q"), asio::use_future).get();
    BOOST_TEST(view->record.turns == 3);
    BOOST_TEST(!view->busy);
}

BOOST_AUTO_TEST_CASE(reject_mode_answers_session_busy) {
    runtime_fixture f({admission_mode::reject, 32});
    f.rec.delay_for["block"] = 500ms;
    BOOST_REQUIRE((f.accept("r", "block")).has_value());
    auto second = f.accept("r", "again");
    BOOST_REQUIRE(!second.has_value());
    BOOST_TEST((second.error().code == errc::session_busy));
    BOOST_REQUIRE(f.wait_finished(1));
    BOOST_TEST((f.accept("r", "later")).has_value());
    BOOST_REQUIRE(f.wait_finished(2));
}

namespace {
// A runtime on one io_context over `st` with the echo agent; `done` collects the finished turns.
struct echo_runtime {
    explicit echo_runtime(std::shared_ptr<store> s, admission_mode mode = admission_mode::queue)
        : st(std::move(s)) {
        agent a;
        a.model = make_echo_model();
        a.config.admission.mode = mode;
        fw.add_agent(a);
        rt.on_turn_finished([this](const turn_record& r) { done.push_back(r); });
    }
    ~echo_runtime() { db.stop(); }
    // Runs the io_context until `n` turns have finished (bounded).
    bool run_until(std::size_t n) {
        auto deadline = std::chrono::steady_clock::now() + 10s;
        ctx.restart();
        while (done.size() < n && std::chrono::steady_clock::now() < deadline)
            ctx.run_one_for(10ms);
        ctx.restart();
        ctx.poll();
        return done.size() == n;
    }
    asio::io_context ctx;
    std::shared_ptr<store> st;
    store_runner db{st};
    framework fw{db, make_default_plugin(db)};
    runtime rt{ctx.get_executor(), fw};
    std::vector<turn_record> done;
};

// Three messages of `session` ("<prefix>0" … "<prefix>2") stored in dir/baton.db, as an earlier
// process accepted them; `first_running`: it was mid-run on the first, `side_effects` begun or not.
std::vector<std::string> store_three(const std::filesystem::path& dir, const std::string& session,
                                     const std::string& prefix, bool first_running = false,
                                     bool side_effects = false) {
    auto st = make_sqlite_store({(dir / "baton.db").string(), "normal"});
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) {
        turn_record t;
        t.turn_id = make_turn_id();
        t.session_id = session;
        t.created_at = now_ms();
        t.input.text = prefix + std::to_string(i);
        st->insert_turn(t, {});
        ids.push_back(t.turn_id);
    }
    if (first_running) st->mark_running(ids[0], now_ms());
    if (first_running && side_effects) st->mark_side_effects(ids[0]);
    return ids;
}

// An earlier process stored three messages of session "rec" and was mid-run on the first, with or
// without side effects begun; a new one recovers them. The turns that end, in order.
std::vector<turn_record> recover_three(const std::filesystem::path& dir, bool side_effects) {
    store_three(dir, "rec", "r", true, side_effects);
    echo_runtime r(std::shared_ptr<store>(make_sqlite_store({(dir / "baton.db").string(), "normal"})));
    auto n = run_bounded(r.ctx, r.rt.recover());
    BOOST_TEST(n == 3u);
    r.run_until(side_effects ? 2u : 3u);
    BOOST_TEST(r.st->unfinished_turns().empty());
    return r.done;
}
} // namespace

BOOST_AUTO_TEST_CASE(a_turn_cut_off_before_side_effects_runs_again_first) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-recover-" + make_turn_id());
    std::filesystem::create_directories(dir);
    auto done = recover_three(dir, false);
    BOOST_REQUIRE_EQUAL(done.size(), 3u);
    BOOST_TEST(*done[0].reply == "echo: r0");
    BOOST_TEST(done[0].attempt == 2);
    BOOST_TEST(*done[1].reply == "echo: r1");
    BOOST_TEST(done[1].attempt == 1);
    BOOST_TEST(*done[2].reply == "echo: r2");
    auto st = make_sqlite_store({(dir / "baton.db").string(), "normal"});
    BOOST_TEST(st->read_tape("rec", 0, 10).size() == 6u);
    BOOST_TEST(st->get_turn(done[0].turn_id)->attempt == 2);
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_turn_cut_off_after_a_tool_call_began_is_abandoned) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-recover-" + make_turn_id());
    std::filesystem::create_directories(dir);
    auto done = recover_three(dir, true);
    BOOST_REQUIRE_EQUAL(done.size(), 2u);
    BOOST_TEST(*done[0].reply == "echo: r1");
    BOOST_TEST(*done[1].reply == "echo: r2");
    auto st = make_sqlite_store({(dir / "baton.db").string(), "normal"});
    // The abandoned turn's message and error entry, then the two turns that ran.
    auto tape = st->read_tape("rec", 0, 10);
    BOOST_REQUIRE_EQUAL(tape.size(), 6u);
    BOOST_TEST(tape[0].payload.at("text").as_string() == "r0");
    BOOST_TEST((tape[1].kind == tape_kind::error));
    BOOST_TEST(tape[1].payload.at("code").as_string() == "abandoned");
    std::filesystem::remove_all(dir);
}

namespace {
// SQLite underneath, counting the calls that write.
class counting_store final : public test::delegating_store {
public:
    explicit counting_store(const std::filesystem::path& file) {
        inner = make_sqlite_store({file.string(), "normal"});
    }
    insert_result insert_turn(const turn_record& t, const idempotency& i) override {
        ++writes;
        return inner->insert_turn(t, i);
    }
    void mark_running(const std::string& id, time_ms at) override {
        ++writes;
        inner->mark_running(id, at);
    }
    void mark_side_effects(const std::string& id) override {
        ++writes;
        inner->mark_side_effects(id);
    }
    void save_state(state_update& u) override {
        ++writes;
        inner->save_state(u);
    }
    void finish_turn(const turn_record& t) override {
        ++writes;
        inner->finish_turn(t);
    }
    bool add_outbox(const outbox_item& o) override {
        ++writes;
        return inner->add_outbox(o);
    }
    std::vector<outbox_item> end_turn(turn_end& e) override {
        ++writes;
        {
            std::lock_guard lock(ends_mutex);
            auto& ids = ends.emplace_back();
            for (const auto& t : e.finished)
                ids.push_back(t.turn_id);
        }
        return inner->end_turn(e);
    }
    std::atomic<int> writes{0};
    std::mutex ends_mutex;
    std::vector<std::vector<std::string>> ends; // the records of each end_turn call
};
} // namespace

// The lean turn: a message to an idle session costs two store calls, its accept and its end
// (tape, state and final record in one transaction); one queued behind another, a third (its start).
BOOST_AUTO_TEST_CASE(a_turn_is_two_store_calls) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-lean-" + make_turn_id());
    std::filesystem::create_directories(dir);
    {
        auto counting = std::make_shared<counting_store>(dir / "baton.db");
        echo_runtime r{std::shared_ptr<store>(counting)};
        auto accept = [&](std::string text) {
            accept_request req;
            req.session_id = "lean";
            req.text = std::move(text);
            asio::co_spawn(r.ctx, r.rt.accept(std::move(req)), asio::detached);
        };
        accept("one");
        BOOST_TEST_REQUIRE(r.run_until(1));
        BOOST_TEST(counting->writes.load() == 2);
        BOOST_TEST(r.done[0].attempt == 1);
        // Two at once: the second waits behind the first and writes its start.
        counting->writes = 0;
        accept("two");
        accept("three");
        BOOST_TEST_REQUIRE(r.run_until(3));
        BOOST_TEST(counting->writes.load() == 5);
        auto& st = r.st;
        auto& done = r.done;
        auto tape = st->read_tape("lean", 0, 100);
        BOOST_TEST(tape.size() == 6u);
        for (const auto& t : done) {
            auto stored = st->get_turn(t.turn_id);
            BOOST_TEST_REQUIRE(stored.has_value());
            BOOST_TEST(to_string(stored->status) == "completed");
            BOOST_TEST(stored->attempt == 1);
        }
    }
    std::filesystem::remove_all(dir);
}

// Found by a new-user check (kill -9 in a loop): the messages a collect turn answered were ended
// each in a transaction of its own after the turn's, so a crash between the two ran one again as a
// turn of its own, answered twice. The turn and the messages it answered end in one.
BOOST_AUTO_TEST_CASE(a_collect_turn_and_the_messages_it_answered_end_in_one_transaction) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-fold-" + make_turn_id());
    std::filesystem::create_directories(dir);
    auto ids = store_three(dir, "fold", "m");
    {
        auto counting = std::make_shared<counting_store>(dir / "baton.db");
        echo_runtime r{std::shared_ptr<store>(counting), admission_mode::collect};
        BOOST_TEST(run_bounded(r.ctx, r.rt.recover()) == 3u);
        BOOST_TEST_REQUIRE(r.run_until(3));
        // The first answered the other two; one end holds all three records, the turn's first.
        BOOST_TEST_REQUIRE(counting->ends.size() == 1u);
        BOOST_TEST(counting->ends[0] == ids);
        for (const auto& t : r.done)
            BOOST_TEST(to_string(t.status) == "completed");
        BOOST_TEST(counting->unfinished_turns().empty());
    }
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
