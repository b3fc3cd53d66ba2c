// The schedule channel (channels/schedule/): the missed-fire policy as plain numbers (next_fire);
// the channel in-process on a memory store with a manual clock (cron slots just before and at their
// time, catch-up, the crash window between accept and cursor write, refusals, a stall); one
// catch-up fire after downtime through baton::service on a SQLite file; and the real daemon through
// its HTTP API (every_ms turns, no double fire after SIGKILL).
#include "channels/schedule/channel.hpp"
#include "tests/clocked_service.hpp"
#include "tests/daemon_fixture.hpp"
#include "tests/utc_time.hpp"
#include "tests/webhook_receiver.hpp"

#include <baton/clock.hpp>
#include <baton/log.hpp>
#include <baton/model.hpp>
#include <baton/pipeline.hpp>
#include <baton/runtime.hpp>
#include <baton/store_runner.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/test/unit_test.hpp>

#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

using namespace baton;
using namespace baton::test;
namespace asio = boost::asio;
using schedule::next_fire;
using schedule::timing;

namespace {

constexpr auto at = [](auto... a) { return utc_ms(a...); };

timing every(std::int64_t ms) {
    return timing{ms, std::nullopt};
}
timing cron_of(std::string_view text) {
    auto c = parse_cron(text);
    BOOST_TEST_REQUIRE(c.has_value(), c.error());
    return timing{std::nullopt, *c};
}

std::string when(std::optional<time_ms> t) {
    return t ? format_time(*t) : "never";
}

// ---- in-process: a runtime on a memory store with the echo model, one thread, bounded runs ----

struct inproc {
    asio::io_context ctx;
    store_runner db{std::shared_ptr<store>(make_memory_store())};
    framework fw{db, make_default_plugin(db)};
    runtime rt{ctx.get_executor(), fw};
    std::vector<std::string> finished; // turn ids, in finishing order
    std::vector<std::string> log_lines;
    std::mutex log_mutex;

    explicit inproc(admission_config adm = {}) {
        agent a;
        a.config.admission = adm;
        a.model = make_echo_model();
        fw.add_agent(a);
        rt.on_turn_finished([this](const turn_record& r) { finished.push_back(r.turn_id); });
        log::set_sink([this](std::string_view line) {
            std::lock_guard lock(log_mutex);
            log_lines.emplace_back(line);
        });
    }
    ~inproc() { log::set_sink({}); }

    // Runs the io_context until `done()` or `limit`; returns done().
    template <class P> bool run_until(P done, std::chrono::milliseconds limit = 5s) {
        return test::run_until(ctx, done, limit);
    }

    // The schedules' clock: it reads `utc` until the test moves it.
    std::shared_ptr<manual_clock> clock;
    schedule::options clock_at(time_ms utc) {
        if (!clock) clock = std::make_shared<manual_clock>(utc);
        BOOST_TEST_REQUIRE(clock->utc_ms() <= utc, "the clock goes forward only");
        clock->advance(std::chrono::milliseconds(utc - clock->utc_ms()));
        schedule::options o;
        o.clock = clock;
        return o;
    }
    void advance(std::chrono::milliseconds d) { clock->advance(d); }
    void advance_to(time_ms utc) { advance(std::chrono::milliseconds(utc - clock->utc_ms())); }
    // Runs until `waits` timers wait on the clock (a schedule's worker parked until its next
    // slot): what was due has happened, and nothing more can until the clock moves.
    bool parked(std::size_t waits = 1) {
        return run_until([&] { return clock->waiting() == waits; });
    }
    std::optional<std::string> cursor(const std::string& name) {
        return db.store().get_cursor(schedule::cursor_name(name));
    }
    std::int64_t session_turns(const std::string& sid) {
        auto s = db.store().get_session(sid);
        return s ? s->turns : 0;
    }
    bool logged(std::string_view needle) {
        std::lock_guard lock(log_mutex);
        for (const auto& l : log_lines)
            if (l.find(needle) != std::string::npos) return true;
        return false;
    }
    // Stops the channel and lets its coroutines end.
    void stop(schedule::channel& ch) {
        ch.stop();
        BOOST_TEST(run_until([&] { return ch.running() == 0; }, 2s));
    }
};

schedule_config sched(std::string name, std::string session, std::string text) {
    schedule_config c;
    c.name = std::move(name);
    c.session = std::move(session);
    c.text = std::move(text);
    return c;
}

// ---- against the real daemon ----

struct schedule_daemon : daemon_fixture {
    // `channels` holds other channels' config (e.g. "webhook").
    explicit schedule_daemon(json::array schedules, json::object channels = {})
        : daemon_fixture(deferred{}) {
        channels["schedules"] = std::move(schedules);
        json::object cfg{{"storage", {{"sqlite", {{"path", (data_dir() / "baton.db").string()}}}}},
                         {"agents", {{"default", {{"model", {{"provider", "echo"}}}}}}},
                         {"channels", std::move(channels)}};
        config_path = write_file("baton.json", json::serialize(cfg));
        start({"--config", config_path.string()});
    }
    void restart() { start({"--config", config_path.string()}); }

    std::int64_t turns(std::string_view sid) const {
        auto r = request("GET", "/v1/sessions/" + std::string(sid));
        if (r.status == 404) return 0;
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        return int_at(body_object(r), "turns");
    }
    // Polls until the session has at least `n` turns; returns the count (fails past `limit`).
    std::int64_t wait_turns(std::string_view sid, std::int64_t n,
                            std::chrono::milliseconds limit) const {
        auto deadline = std::chrono::steady_clock::now() + limit;
        std::int64_t got = turns(sid);
        while (got < n && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(10ms);
            got = turns(sid);
        }
        BOOST_TEST_REQUIRE(got >= n, "session " << sid << " has " << got << " turns, wanted " << n
                                                << "\n"
                                                << log());
        return got;
    }
    json::object last_turn(std::string_view sid) const {
        auto s = request("GET", "/v1/sessions/" + std::string(sid));
        auto tid = string_at(body_object(s), "last_turn_id");
        BOOST_TEST_REQUIRE(!tid.empty(), s.body);
        return wait_for_turn(tid);
    }
    // created_at of the session's user messages, from its tape.
    std::vector<time_ms> user_messages(std::string_view sid) const {
        auto r = request("GET", "/v1/sessions/" + std::string(sid) + "/tape?limit=1000");
        BOOST_TEST_REQUIRE(r.status == 200u, r.body);
        std::vector<time_ms> out;
        for (const auto& e : body_object(r).at("entries").as_array()) {
            const auto& o = e.as_object();
            if (string_at(o, "kind") != "message") continue;
            if (string_at(o.at("payload").as_object(), "role") != "user") continue;
            out.push_back(parse_utc_ms(string_at(o, "created_at")));
        }
        return out;
    }

    std::filesystem::path config_path;
};

json::object every_schedule(std::string name, std::int64_t ms, std::string session) {
    return {{"name", std::move(name)},
            {"every_ms", ms},
            {"session", std::move(session)},
            {"text", "report"}};
}

void sleep_until_ms(time_ms t) {
    auto left = t - now_ms();
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(left));
}

// Runs one statement on the daemon's SQLite file (the daemon is not running) with text
// parameters ?1, ?2, ...; returns the first column of its first row, if any.
std::optional<std::string> sqlite_once(const std::filesystem::path& file, const char* sql,
                                       const std::vector<std::string>& params) {
    sqlite3* db = nullptr;
    BOOST_TEST_REQUIRE(sqlite3_open(file.string().c_str(), &db) == SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    BOOST_TEST_REQUIRE(sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK, sqlite3_errmsg(db));
    for (std::size_t i = 0; i < params.size(); ++i)
        sqlite3_bind_text(st, static_cast<int>(i + 1), params[i].c_str(), -1, SQLITE_TRANSIENT);
    std::optional<std::string> out;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    BOOST_TEST((rc == SQLITE_ROW || rc == SQLITE_DONE), sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(schedule_channel)

BOOST_AUTO_TEST_CASE(next_fire_of_an_interval) {
    const time_ms now = at(2026, 11, 30, 12, 0);
    // First start: one period from now, no fire at start.
    BOOST_TEST(*next_fire(every(60000), std::nullopt, now) == now + 60000);
    // Not yet due: last + every (the phase survives a restart).
    BOOST_TEST(*next_fire(every(60000), now - 20000, now) == now + 40000);
    // Exactly due: that slot, at once.
    BOOST_TEST(*next_fire(every(60000), now - 60000, now) == now);
    // Several slots missed: only the latest, at once; the one after it is in the future.
    auto missed = *next_fire(every(60000), now - 5 * 60000 - 15000, now);
    BOOST_TEST(missed == now - 15000);
    BOOST_TEST(*next_fire(every(60000), missed, now) == now + 45000);
    // A cursor from the future (the clock went back) waits one period at most.
    BOOST_TEST(*next_fire(every(60000), now + 3600000, now) == now + 60000);
}

BOOST_AUTO_TEST_CASE(next_fire_of_a_cron_schedule) {
    const auto noon = cron_of("0 12 * * *");
    // First start: the next match after now.
    BOOST_TEST(when(next_fire(noon, std::nullopt, at(2026, 11, 30, 11, 0))) ==
               "2026-11-30T12:00:00.000Z");
    BOOST_TEST(when(next_fire(noon, std::nullopt, at(2026, 11, 30, 12, 0))) ==
               "2026-12-01T12:00:00.000Z");
    // Fired yesterday, not yet due today.
    BOOST_TEST(when(next_fire(noon, at(2026, 11, 29, 12, 0), at(2026, 11, 30, 11, 0))) ==
               "2026-11-30T12:00:00.000Z");
    // Down for three days: the latest missed slot, once.
    BOOST_TEST(when(next_fire(noon, at(2026, 11, 27, 12, 0), at(2026, 11, 30, 13, 0))) ==
               "2026-11-30T12:00:00.000Z");
    BOOST_TEST(when(next_fire(noon, at(2026, 11, 30, 12, 0), at(2026, 11, 30, 13, 0))) ==
               "2026-12-01T12:00:00.000Z");
    // Month and year ends.
    BOOST_TEST(when(next_fire(cron_of("0 0 1 * *"), at(2026, 12, 1), at(2026, 12, 31, 23, 59, 59))) ==
               "2027-01-01T00:00:00.000Z");
    BOOST_TEST(when(next_fire(cron_of("0 0 30 2 *"), std::nullopt, at(2026, 1, 1))) == "never");
}

BOOST_AUTO_TEST_CASE(keys_and_cursor_names) {
    BOOST_TEST(schedule::fire_key("nightly", 1764504000000) == "schedule nightly 1764504000000");
    BOOST_TEST(schedule::cursor_name("nightly") == "schedule:nightly");
}

BOOST_AUTO_TEST_CASE(a_cron_slot_fires_into_its_session_at_its_time) {
    inproc p;
    auto cfg = sched("noon", "sched:noon", "report");
    cfg.cron = "0 12 * * *";
    // 200 ms before noon.
    schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg},
                         p.clock_at(at(2026, 11, 30, 11, 59, 59) + 800));
    ch.start();
    BOOST_TEST_REQUIRE(p.parked());
    p.advance(199ms);
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:noon") == 0);
    p.advance(1ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return !p.finished.empty(); }));
    auto rec = p.db.store().get_turn(p.finished[0]);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(rec->session_id == "sched:noon");
    BOOST_TEST(rec->input.channel == "schedule");
    BOOST_TEST(rec->input.text == "report");
    BOOST_TEST((rec->status == turn_status::completed));
    BOOST_TEST(rec->reply.value_or("") == "echo: report");
    BOOST_TEST(json::serialize(rec->input.metadata) ==
               R"({"schedule":"noon","fire_at":"2026-11-30T12:00:00.000Z"})");
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.cursor("noon").value_or("") == std::to_string(at(2026, 11, 30, 12, 0)));
    // The next slot is tomorrow: nothing fires until then (one jump: woken after its longest
    // wait, the worker reads the clock again), then it does.
    p.advance_to(at(2026, 12, 1, 12, 0) - 1);
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:noon") == 1);
    p.advance(1ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.finished.size() == 2; }));
    rec = p.db.store().get_turn(p.finished[1]);
    BOOST_TEST(rec->input.metadata.at("fire_at").as_string() == "2026-12-01T12:00:00.000Z");
    p.stop(ch);
}

BOOST_AUTO_TEST_CASE(missed_cron_slots_fire_once_at_start) {
    inproc p;
    p.db.store().set_cursor("schedule:noon", std::to_string(at(2026, 11, 27, 12, 0)));
    auto cfg = sched("noon", "sched:noon", "report");
    cfg.cron = "0 12 * * *";
    schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(at(2026, 11, 30, 12, 0, 30)));
    ch.start();
    BOOST_TEST_REQUIRE(p.run_until([&] { return !p.finished.empty(); }));
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:noon") == 1);
    auto rec = p.db.store().get_turn(p.finished[0]);
    BOOST_TEST(rec->input.metadata.at("fire_at").as_string() == "2026-11-30T12:00:00.000Z");
    BOOST_TEST(p.cursor("noon").value_or("") == std::to_string(at(2026, 11, 30, 12, 0)));
    // Once: nothing more until tomorrow's slot.
    p.advance_to(at(2026, 12, 1, 12, 0) - 1);
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:noon") == 1);
    BOOST_TEST(p.finished.size() == 1u);
    p.stop(ch);
}

BOOST_AUTO_TEST_CASE(the_first_start_is_remembered_across_restarts) {
    inproc p;
    auto cfg = sched("hourly", "sched:first", "report");
    cfg.every_ms = 3600000;
    const time_ms start = at(2026, 11, 30, 9, 0);
    {
        // First start: nothing fires, but the start is stored.
        schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(start));
        ch.start();
        BOOST_TEST_REQUIRE(p.run_until([&] { return p.cursor("hourly").has_value(); }));
        BOOST_TEST_REQUIRE(p.parked());
        p.stop(ch);
    }
    BOOST_TEST(p.finished.empty());
    BOOST_TEST(std::stoll(*p.cursor("hourly")) == start);
    // Back 90 minutes later: the slot one hour after the first start was missed, and fires now.
    schedule::channel again(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(start + 5400000));
    again.start();
    BOOST_TEST_REQUIRE(p.run_until([&] { return !p.finished.empty(); }));
    auto rec = p.db.store().get_turn(p.finished[0]);
    BOOST_TEST(rec->input.metadata.at("fire_at").as_string() == format_time(start + 3600000));
    // Then the old phase: nothing until two hours after the first start.
    BOOST_TEST_REQUIRE(p.parked());
    p.advance_to(start + 7200000 - 1);
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.finished.size() == 1u);
    p.advance(1ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.finished.size() == 2; }));
    rec = p.db.store().get_turn(p.finished[1]);
    BOOST_TEST(rec->input.metadata.at("fire_at").as_string() == format_time(start + 7200000));
    p.stop(again);
}

BOOST_AUTO_TEST_CASE(a_slot_accepted_before_a_lost_cursor_write_is_not_fired_again) {
    inproc p;
    auto cfg = sched("noon", "sched:noon", "report");
    cfg.cron = "0 12 * * *";
    const auto before = std::to_string(at(2026, 11, 29, 12, 0));
    p.db.store().set_cursor("schedule:noon", before);
    {
        schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(at(2026, 11, 30, 12, 0, 30)));
        ch.start();
        BOOST_TEST_REQUIRE(p.run_until([&] { return !p.finished.empty(); }));
        p.stop(ch);
    }
    // As if the process had died between the accept and the cursor write.
    p.db.store().set_cursor("schedule:noon", before);
    schedule::channel again(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(at(2026, 11, 30, 12, 0, 40)));
    again.start();
    BOOST_TEST(p.run_until([&] { return p.cursor("noon") != before; }));
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:noon") == 1);
    BOOST_TEST(p.finished.size() == 1u);
    BOOST_TEST(p.logged("schedule: slot already fired"));
    BOOST_TEST(p.cursor("noon").value_or("") == std::to_string(at(2026, 11, 30, 12, 0)));
    p.stop(again);
}

namespace {
// A model step that takes 1500 ms of `c`'s time and answers nothing.
asio::awaitable<std::optional<model_output>> slow_step(std::shared_ptr<baton::clock> c) {
    baton::timer t(std::move(c), co_await asio::this_coro::executor, 1500ms);
    co_await t.async_wait(asio::use_awaitable);
    co_return std::nullopt;
}
} // namespace

BOOST_AUTO_TEST_CASE(a_full_session_queue_skips_the_fire_and_the_cursor_moves_on) {
    inproc p(admission_config{admission_mode::queue, 0});
    const time_ms fake_now = at(2026, 11, 30, 12, 0);
    auto opts = p.clock_at(fake_now);
    // The session is busy with a slow turn: the schedule's message finds no room.
    plugin slow;
    slow.name = "slow";
    slow.run_model = [c = p.clock](turn_context&, prompt&) { return slow_step(c); };
    p.fw.register_plugin(slow);
    accept_request busy;
    busy.session_id = "sched:busy";
    busy.text = "long";
    p.ctx.restart();
    auto f = asio::co_spawn(p.ctx, p.rt.accept(busy), asio::use_future);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.rt.running_turns() == 1; }));
    p.db.store().set_cursor("schedule:tick", std::to_string(fake_now - 5500));
    auto cfg = sched("tick", "sched:busy", "report");
    cfg.every_ms = 1000;
    schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg}, opts);
    ch.start();
    BOOST_TEST(p.run_until([&] { return p.cursor("tick") == std::to_string(fake_now - 500); }));
    BOOST_TEST(p.logged("session_queue_full"));
    BOOST_TEST(p.session_turns("sched:busy") == 1);
    p.stop(ch);
    p.advance(1500ms); // the slow turn ends
    BOOST_TEST(p.run_until([&] { return p.finished.size() == 1; }));
}

// Found under ThreadSanitizer, whose slowness made a timer fire 290 ms late: the late slot and
// the one that passed meanwhile fired back to back. Now a late wake-up fires once, for the latest.
BOOST_AUTO_TEST_CASE(a_stall_longer_than_the_period_fires_once_for_the_latest_slot) {
    inproc p;
    const time_ms start = at(2026, 11, 30, 12, 0);
    p.db.store().set_cursor("schedule:tick", std::to_string(start));
    auto cfg = sched("tick", "sched:stall", "report");
    cfg.every_ms = 300;
    schedule::channel ch(p.ctx.get_executor(), p.rt, {cfg}, p.clock_at(start + 1));
    ch.start();
    BOOST_TEST_REQUIRE(p.parked());
    p.advance(298ms);
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.finished.empty());
    p.advance(1ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.finished.size() == 1; })); // slot +300
    BOOST_TEST_REQUIRE(p.parked());
    // The process stalls 700 ms: slots +600 and +900 pass meanwhile, and one fire comes.
    p.advance(700ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.finished.size() == 2; }));
    BOOST_TEST_REQUIRE(p.parked());
    BOOST_TEST(p.session_turns("sched:stall") == 2);
    p.advance(200ms);
    BOOST_TEST_REQUIRE(p.run_until([&] { return p.finished.size() == 3; }));
    p.stop(ch);
    std::vector<std::string> slots;
    for (const auto& tid : p.finished) {
        auto rec = p.db.store().get_turn(tid);
        BOOST_REQUIRE(rec);
        slots.emplace_back(rec->input.metadata.at("fire_at").as_string());
    }
    BOOST_TEST(slots == (std::vector<std::string>{format_time(start + 300), format_time(start + 900),
                                                  format_time(start + 1200)}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_interval_schedule_runs_turns_in_its_session) {
    schedule_daemon d(json::array{every_schedule("tick", 200, "sched:tick")});
    d.wait_turns("sched:tick", 4, 10s);
    auto s = d.request("GET", "/v1/sessions/sched:tick");
    BOOST_TEST(string_at(body_object(s), "agent") == "default");
    auto last = d.last_turn("sched:tick");
    BOOST_TEST(string_at(last, "status") == "completed");
    BOOST_TEST(string_at(last, "reply") == "echo: report");
    auto tape = d.request("GET", "/v1/sessions/sched:tick/tape");
    BOOST_TEST(tape.body.find(R"("text":"report")") != std::string::npos, tape.body);
    BOOST_TEST(tape.body.find(R"("text":"echo: report")") != std::string::npos, tape.body);
    // No burst: fires come about a period apart. One short gap is the missed-fire rule at work:
    // a fire that takes longer than the period (a slow accept: up to 300 ms under
    // ThreadSanitizer) lets the next slot pass, and that slot then fires at once, once. Two short
    // gaps in a row would be a burst.
    auto times = d.user_messages("sched:tick");
    BOOST_TEST_REQUIRE(times.size() >= 4u);
    for (std::size_t i = 2; i < times.size(); ++i)
        BOOST_TEST((times[i] - times[i - 1] >= 50 || times[i - 1] - times[i - 2] >= 50),
                   "fires " << i - 2 << ", " << i - 1 << " and " << i);
    // Its timer does not hold up a drain.
    auto t0 = std::chrono::steady_clock::now();
    BOOST_TEST(d.stop() == 0);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 3s));
}

BOOST_AUTO_TEST_CASE(a_schedule_delivers_its_reply_where_it_says) {
    webhook_receiver hook;
    auto push = every_schedule("push", 300, "sched:push");
    push["deliver"] = {{"channel", "webhook"}, {"to", "crm"}};
    schedule_daemon d(json::array{push}, {{"webhook", {{"targets", {{"crm", {{"url", hook.url()}}}}}}}});
    BOOST_TEST_REQUIRE(hook.wait_delivered(1, 10s), d.log());
    const auto requests = hook.requests();
    const auto& body = requests.at(0).body;
    BOOST_TEST_REQUIRE(body.is_object());
    BOOST_TEST(string_at(body.as_object(), "session_id") == "sched:push");
    BOOST_TEST(string_at(body.as_object(), "target") == "crm");
    BOOST_TEST(string_at(body.as_object(), "text") == "echo: report");
}

// Through baton::service on a SQLite file, stopped and started again with its clock moved on.
BOOST_AUTO_TEST_CASE(missed_fires_during_downtime_fire_once_at_restart) {
    using std::chrono::milliseconds;
    constexpr time_ms period = 2000;
    scratch_dir dir;
    auto o = clocked_service::memory_options();
    o.config.storage.type = storage_config::kind::sqlite;
    o.config.storage.sqlite_path = (dir.root / "baton.db").string();
    auto tick = sched("tick", "sched:down", "report");
    tick.every_ms = period;
    o.config.channels.schedules = {tick};
    const time_ms start = at(2026, 11, 30, 12, 0);
    clocked_service s(o, start);
    auto cursor = [&] {
        std::vector<std::string> names{schedule::cursor_name("tick")};
        auto got = s.run(s.svc->runtime().read_cursors(std::move(names)));
        BOOST_TEST_REQUIRE(got.has_value());
        return std::stoll(got->front().value_or("-1"));
    };
    s.start();
    BOOST_TEST_REQUIRE(s.parked());
    s.clock->advance(milliseconds(period));
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("sched:down") == 1; }));
    BOOST_TEST_REQUIRE(s.parked());
    const time_ms last = start + period;
    BOOST_TEST(cursor() == last);
    s.stop();
    // Down past three more slots (last + P, + 2P, + 3P) at least: stop() moves the clock on to
    // any wait still pending while the service stops, so the latest missed slot is reckoned from
    // where the clock stands.
    s.clock->advance(milliseconds(3 * period + 100));
    const time_ms down_until = s.clock->utc_ms();
    const time_ms caught_up = last + (down_until - last) / period * period;
    BOOST_TEST_REQUIRE(caught_up >= last + 3 * period);
    s.restart();
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("sched:down") == 2; }), s.log_text());
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(cursor() == caught_up, s.log_text());
    // Once, not once per missed slot; then the normal schedule, in its old phase.
    s.clock->advance(milliseconds(caught_up + period - 1 - s.clock->utc_ms()));
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(s.turns("sched:down") == 2);
    s.clock->advance(milliseconds(1));
    BOOST_TEST_REQUIRE(eventually([&] { return s.turns("sched:down") == 3; }));
    BOOST_TEST_REQUIRE(s.parked());
    BOOST_TEST(cursor() == caught_up + period);
}

BOOST_AUTO_TEST_CASE(no_double_fire_after_sigkill_and_restart) {
    constexpr time_ms period = 2000;
    schedule_daemon d(json::array{every_schedule("tick", period, "sched:kill")});
    const auto n0 = d.wait_turns("sched:kill", 1, 10s);
    const time_ms last = parse_utc_ms(string_at(d.last_turn("sched:kill"), "created_at"));
    d.crash();
    // Whether or not the kill came between the accept and the cursor write, put the file in the
    // state it would leave: the slot accepted, the cursor one slot behind.
    const auto db_file = d.data_dir() / "baton.db";
    auto cursor = sqlite_once(db_file, "SELECT value FROM cursors WHERE name = ?1", {"schedule:tick"});
    if (cursor)
        sqlite_once(db_file, "UPDATE cursors SET value = ?1 WHERE name = ?2",
                    {std::to_string(std::stoll(*cursor) - period), "schedule:tick"});
    d.restart();
    // The rewound slot is due again at start, under the same idempotency key: no new turn.
    sleep_until_ms(last + period - 200);
    BOOST_TEST(d.turns("sched:kill") == n0);
    if (cursor) BOOST_TEST(d.log().find("schedule: slot already fired") != std::string::npos, d.log());
    d.wait_turns("sched:kill", n0 + 1, 10s);
    const time_ms next = parse_utc_ms(string_at(d.last_turn("sched:kill"), "created_at"));
    BOOST_TEST(next >= last + period - 100);
    // And once more, a plain SIGKILL and restart: the schedule goes on without a double fire.
    d.crash();
    d.restart();
    sleep_until_ms(next + period - 200);
    BOOST_TEST(d.turns("sched:kill") == n0 + 1);
    d.wait_turns("sched:kill", n0 + 2, 10s);
}

BOOST_AUTO_TEST_SUITE_END()
