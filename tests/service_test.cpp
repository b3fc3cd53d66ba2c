// baton::service as an embedder uses it (<baton/service.hpp>, <baton/channel.hpp>): every kind of
// completion token, cancellation of a wait, the error codes with their diagnostics,
// subscriptions, and a channel of the test's own through its whole life, cursors included.
#include <baton/detail/async.hpp>
#include <baton/service.hpp>
#include <baton/strand.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

using namespace baton;
namespace asio = boost::asio;
using namespace std::chrono_literals;
using boost::system::error_code;

namespace {

// One io thread for the service; every wait of the test is bounded by wait_for().
struct service_fixture {
    asio::io_context io{1};
    asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
    std::thread thread{[this] { io.run(); }};
    ~service_fixture() {
        work.reset();
        io.stop();
        thread.join();
    }
    static service_options memory_options() {
        service_options o;
        o.http = false;
        o.config.storage.type = storage_config::kind::memory;
        return o;
    }
    // SQLite in DIR/baton.db (DIR made here; the test removes it).
    static service_options sqlite_options(const std::filesystem::path& dir) {
        std::filesystem::create_directories(dir);
        auto o = memory_options();
        o.config.storage.type = storage_config::kind::sqlite;
        o.config.storage.sqlite_path = (dir / "baton.db").string();
        return o;
    }
};

template <class T> T get(std::future<T>& f) {
    BOOST_REQUIRE_MESSAGE(f.wait_for(10s) == std::future_status::ready, "no answer within 10 s");
    return f.get();
}

// A model that answers only once released (on the service's thread).
struct gated_model : model_client {
    explicit gated_model(asio::any_io_executor ex) : gate(ex, asio::steady_timer::time_point::max()) {}
    asio::steady_timer gate;
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        co_await gate.async_wait(asio::as_tuple(asio::use_awaitable));
        chat_completion c;
        c.text = "released: " + req.messages.back().content;
        co_return c;
    }
    std::string name() const override { return "gated"; }
};

accept_request message(std::string session, std::string text, std::string key = {}) {
    accept_request m;
    m.session_id = std::move(session);
    m.text = std::move(text);
    m.idem.key = std::move(key);
    m.idem.fingerprint = m.text;
    return m;
}

} // namespace

BOOST_AUTO_TEST_SUITE(service_api)

BOOST_FIXTURE_TEST_CASE(every_kind_of_token_runs_a_turn, service_fixture) {
    service svc(io.get_executor(), memory_options());
    auto started = svc.async_start(asio::use_future);
    get(started);
    BOOST_TEST(svc.running());

    // A plain callback.
    std::promise<std::pair<error_code, accepted>> submitted;
    svc.async_submit(message("s1", "hello"), [&](error_code ec, accepted a) {
        submitted.set_value({ec, std::move(a)});
    });
    auto sf = submitted.get_future();
    auto [ec, a] = get(sf);
    BOOST_REQUIRE(!ec);
    BOOST_TEST(a.session_id == "s1");

    // use_awaitable, inside a coroutine of the program's.
    auto waited = asio::co_spawn(
        io,
        [&]() -> asio::awaitable<turn_record> {
            co_return co_await svc.async_wait_turn(a.turn_id, asio::use_awaitable);
        },
        asio::use_future);
    auto rec = get(waited);
    BOOST_TEST(to_string(rec.status) == "completed");
    BOOST_TEST(*rec.reply == "echo: hello");

    // deferred: nothing runs until the operation is started with a token of its own.
    auto op = svc.async_get_turn(a.turn_id, asio::deferred);
    auto got = std::move(op)(asio::use_future);
    BOOST_TEST(*get(got).reply == "echo: hello");

    // use_future; the tape has the message and the reply.
    auto tape = svc.async_read_tape("s1", 0, 100, asio::use_future);
    auto entries = get(tape);
    BOOST_REQUIRE_EQUAL(entries.size(), 2u);
    BOOST_TEST(entries[1].payload.at("text").as_string() == "echo: hello");

    auto stopped = svc.async_stop(asio::use_future);
    get(stopped);
    BOOST_TEST(!svc.running());
}

BOOST_FIXTURE_TEST_CASE(a_cancelled_wait_ends_while_the_turn_goes_on, service_fixture) {
    service svc(io.get_executor(), memory_options());
    auto model = std::make_shared<gated_model>(io.get_executor());
    agent_config cfg;
    svc.add_agent(cfg, model);
    auto started = svc.async_start(asio::use_future);
    get(started);
    auto sub = svc.async_submit(message("s1", "slow"), asio::use_future);
    auto a = get(sub);

    asio::cancellation_signal cancel;
    std::promise<error_code> first;
    svc.async_wait_turn(a.turn_id,
                        asio::bind_cancellation_slot(
                            cancel.slot(), [&](error_code ec, turn_record) { first.set_value(ec); }));
    // Both on the service's thread: the wait has begun before it is cancelled.
    asio::post(io, [&] { asio::post(io, [&] { cancel.emit(asio::cancellation_type::terminal); }); });
    auto ff = first.get_future();
    BOOST_TEST(get(ff) == asio::error::operation_aborted);

    auto status = svc.async_get_turn(a.turn_id, asio::use_future);
    BOOST_TEST(to_string(get(status).status) == "running");

    auto second = svc.async_wait_turn(a.turn_id, asio::use_future);
    asio::post(io, [&] { model->gate.cancel(); });
    auto rec = get(second);
    BOOST_TEST(to_string(rec.status) == "completed");
    BOOST_TEST(*rec.reply == "released: slow");
    auto stopped = svc.async_stop(asio::use_future);
    get(stopped);
}

// A model that never answers; it counts the calls it was in and the ones that ended.
struct stuck_model : model_client {
    std::atomic<int> calls{0}, ended{0};
    asio::awaitable<chat_completion> complete(const model_request&, const delta_handler&) override {
        ++calls;
        struct count_end {
            std::atomic<int>& n;
            ~count_end() { ++n; }
        } end{ended};
        asio::steady_timer never(co_await asio::this_coro::executor,
                                 asio::steady_timer::time_point::max());
        co_await never.async_wait(asio::use_awaitable); // throws once the turn is stopped
        co_return chat_completion{};
    }
    std::string name() const override { return "stuck"; }
};

// The drain's grace runs out on a running turn: the turn stops there, before async_stop completes
// (nothing of it runs on the executor afterwards), and nothing more of it is stored: it stays
// `running`, as a crash would leave it, for the next start to decide. A wait begun after the stop
// answers draining at once.
BOOST_FIXTURE_TEST_CASE(a_turn_past_the_drain_grace_stops_and_is_left_running, service_fixture) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-service-" + make_turn_id());
    auto o = sqlite_options(dir);
    o.drain_grace = 50ms;
    std::string turn_id;
    {
        service svc(io.get_executor(), o);
        auto model = std::make_shared<stuck_model>();
        svc.add_agent(agent_config{}, model);
        auto started = svc.async_start(asio::use_future);
        get(started);
        auto sub = svc.async_submit(message("s1", "forever"), asio::use_future);
        turn_id = get(sub).turn_id;
        for (int i = 0; i < 1000 && model->calls.load() == 0; ++i)
            std::this_thread::sleep_for(5ms);
        BOOST_TEST_REQUIRE(model->calls.load() == 1);
        auto stopped = svc.async_stop(asio::use_future);
        get(stopped);
        BOOST_TEST(model->ended.load() == 1); // the model call was unwound by the stop
        auto rec = svc.async_get_turn(turn_id, asio::use_future);
        BOOST_TEST(to_string(get(rec).status) == "running");
        std::promise<error_code> waited;
        svc.async_wait_turn(turn_id, [&](error_code ec, turn_record) { waited.set_value(ec); });
        auto wf = waited.get_future();
        BOOST_TEST((get(wf) == errc::draining));
    }
    {
        // The next start runs it again (it had begun no side effect), as after a crash.
        service svc(io.get_executor(), o);
        auto started = svc.async_start(asio::use_future);
        get(started);
        auto waited = svc.async_wait_turn(turn_id, asio::use_future);
        auto rec = get(waited);
        BOOST_TEST(to_string(rec.status) == "completed");
        BOOST_TEST(rec.attempt == 2);
        auto stopped = svc.async_stop(asio::use_future);
        get(stopped);
    }
    std::filesystem::remove_all(dir);
}

// A model call that ignores cancellation (a timer outside the turn's cancellation slot) holds the
// stop until it returns, however long, rather than outliving it: the service may be destroyed
// right after async_stop, and the call must be over by then.
struct deaf_model : model_client {
    std::atomic<int> calls{0}, ended{0};
    std::chrono::milliseconds deaf_for;
    explicit deaf_model(std::chrono::milliseconds d) : deaf_for(d) {}
    asio::awaitable<chat_completion> complete(const model_request&, const delta_handler&) override {
        ++calls;
        asio::steady_timer t(co_await asio::this_coro::executor, deaf_for);
        co_await t.async_wait(
            asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
        ++ended;
        co_return chat_completion{};
    }
    std::string name() const override { return "deaf"; }
};

BOOST_FIXTURE_TEST_CASE(a_hook_deaf_to_cancellation_holds_the_stop_until_it_returns, service_fixture) {
    auto o = memory_options();
    o.drain_grace = 50ms;
    auto model = std::make_shared<deaf_model>(6s); // past the 5 s a warning repeats at
    {
        service svc(io.get_executor(), o);
        svc.add_agent(agent_config{}, model);
        auto started = svc.async_start(asio::use_future);
        get(started);
        auto sub = svc.async_submit(message("s1", "deaf"), asio::use_future);
        get(sub);
        for (int i = 0; i < 1000 && model->calls.load() == 0; ++i)
            std::this_thread::sleep_for(5ms);
        BOOST_TEST_REQUIRE(model->calls.load() == 1);
        auto stopped = svc.async_stop(asio::use_future);
        BOOST_TEST_REQUIRE((stopped.wait_for(20s) == std::future_status::ready));
        get(stopped);
        BOOST_TEST(model->ended.load() == 1); // over before the stop completed
    } // destroyed at once: nothing of the turn may run after this
    std::this_thread::sleep_for(100ms);
}

BOOST_FIXTURE_TEST_CASE(failures_come_as_baton_errc_with_diagnostics, service_fixture) {
    {
        auto o = memory_options();
        o.config.agents["default"].model.provider = "nonesuch";
        service broken(io.get_executor(), o);
        diagnostics diag;
        auto started = broken.async_start(diag, asio::use_future);
        try {
            get(started);
            BOOST_FAIL("a service with an unknown provider started");
        } catch (const boost::system::system_error& e) {
            BOOST_TEST(e.code() == make_error_code(errc::invalid_config));
            BOOST_TEST(e.code().category().name() == std::string("baton"));
        }
        BOOST_TEST(diag.message().find("unknown provider nonesuch") != std::string::npos);
    }
    {
        // A malformed listen address is named as such, not refused as a remote one.
        auto o = memory_options();
        o.http = true;
        o.config.server.listen = "not an address";
        service broken(io.get_executor(), o);
        diagnostics diag;
        std::promise<error_code> refused;
        broken.async_start(diag, [&](error_code ec) { refused.set_value(ec); });
        auto rf = refused.get_future();
        BOOST_TEST((get(rf) == errc::invalid_config));
        BOOST_TEST(diag.message().starts_with("server.listen: expected IP:PORT"), diag.message());
    }
    service svc(io.get_executor(), memory_options());
    auto started = svc.async_start(asio::use_future);
    get(started);

    std::promise<error_code> again;
    svc.async_start([&](error_code ec) { again.set_value(ec); });
    auto af = again.get_future();
    BOOST_TEST(get(af) == make_error_code(errc::invalid_request));

    diagnostics diag;
    auto m = message("s1", "hi");
    m.agent = "nobody";
    std::promise<error_code> refused;
    svc.async_submit(std::move(m), diag, [&](error_code ec, accepted) { refused.set_value(ec); });
    auto rf = refused.get_future();
    BOOST_TEST(get(rf) == make_error_code(errc::invalid_request));
    BOOST_TEST(!diag.message().empty());

    std::promise<error_code> missing;
    svc.async_get_turn("t_nonesuch", [&](error_code ec, turn_record) { missing.set_value(ec); });
    auto mf = missing.get_future();
    BOOST_TEST(get(mf) == make_error_code(errc::not_found));

    auto sub = svc.async_submit(message("s1", "done"), asio::use_future);
    auto a = get(sub);
    auto waited = svc.async_wait_turn(a.turn_id, asio::use_future);
    get(waited);
    std::promise<error_code> late;
    svc.async_cancel(a.turn_id, [&](error_code ec) { late.set_value(ec); });
    auto lf = late.get_future();
    BOOST_TEST(get(lf) == make_error_code(errc::turn_not_running));

    std::promise<error_code> bad_limit;
    svc.async_read_tape("s1", 0, 0,
                        [&](error_code ec, std::vector<tape_entry>) { bad_limit.set_value(ec); });
    auto bf = bad_limit.get_future();
    BOOST_TEST(get(bf) == make_error_code(errc::invalid_request));

    // The same key and text: the same turn, replayed. The same key with other text: refused.
    auto k1 = svc.async_submit(message("s2", "once", "key-1"), asio::use_future);
    auto k2 = svc.async_submit(message("s2", "once", "key-1"), asio::use_future);
    auto first = get(k1), second = get(k2);
    BOOST_TEST(second.replayed);
    BOOST_TEST(second.turn_id == first.turn_id);
    std::promise<error_code> reused;
    svc.async_submit(message("s2", "other", "key-1"),
                     [&](error_code ec, accepted) { reused.set_value(ec); });
    auto uf = reused.get_future();
    BOOST_TEST(get(uf) == make_error_code(errc::idempotency_key_reused));
    auto stopped = svc.async_stop(asio::use_future);
    get(stopped);
}

BOOST_FIXTURE_TEST_CASE(subscriptions_hand_over_a_sessions_and_a_turns_events, service_fixture) {
    service svc(io.get_executor(), memory_options());
    auto started = svc.async_start(asio::use_future);
    get(started);
    auto session = svc.subscribe_session("s1");
    auto sub = svc.async_submit(message("s1", "watch me"), asio::use_future);
    auto a = get(sub);

    std::vector<std::string> types;
    for (;;) {
        auto next = session.async_next(asio::use_future);
        auto e = get(next);
        BOOST_TEST(e.turn_id == a.turn_id);
        types.push_back(e.event->type);
        if (e.event->type == "turn.finished") break;
    }
    BOOST_TEST(types.front() == "turn.queued");
    BOOST_TEST((std::find(types.begin(), types.end(), "turn.started") != types.end()));
    BOOST_TEST(session.gap() == 0u);

    // A finished turn's subscription replays its kept events, turn.finished last, then eof.
    error_code ec;
    auto turn = svc.subscribe_turn(a.turn_id, ec);
    BOOST_REQUIRE(!ec);
    std::vector<std::string> replayed;
    std::int64_t last_seq = 0;
    for (;;) {
        std::promise<std::pair<error_code, service_event>> p;
        turn.async_next([&](error_code e, service_event ev) { p.set_value({e, std::move(ev)}); });
        auto pf = p.get_future();
        auto [e, ev] = get(pf);
        if (e) {
            BOOST_TEST(e == asio::error::eof);
            break;
        }
        BOOST_TEST(ev.event->seq > last_seq);
        last_seq = ev.event->seq;
        replayed.push_back(ev.event->type);
    }
    BOOST_TEST(replayed == types, boost::test_tools::per_element());

    svc.subscribe_turn("t_nonesuch", ec);
    BOOST_TEST(ec == make_error_code(errc::not_found));

    // A wait for the next event ends with operation_aborted when cancelled; close() ends it.
    asio::cancellation_signal cancel;
    std::promise<error_code> aborted;
    session.async_next(asio::bind_cancellation_slot(
        cancel.slot(), [&](error_code e, service_event) { aborted.set_value(e); }));
    asio::post(io, [&] { asio::post(io, [&] { cancel.emit(asio::cancellation_type::partial); }); });
    auto abf = aborted.get_future();
    BOOST_TEST(get(abf) == asio::error::operation_aborted);
    session.close();
    std::promise<error_code> closed;
    session.async_next([&](error_code e, service_event) { closed.set_value(e); });
    auto cf = closed.get_future();
    BOOST_TEST(get(cf) == asio::error::eof);
    auto stopped = svc.async_stop(asio::use_future);
    get(stopped);
}

namespace {
// A channel of the test's own: records its life, keeps a cursor and submits through its host.
struct recording_channel : channel {
    std::vector<std::string> calls;
    channel_host* host = nullptr;
    std::optional<std::string> cursor_at_start;
    std::string turn_id;
    std::string_view name() const override { return "recording"; }
    void attach(channel_host& h) override {
        host = &h;
        calls.push_back("attach");
    }
    asio::awaitable<void> start() override {
        calls.push_back("start");
        std::vector<std::string> names{"recording.cursor"};
        auto read = co_await host->runtime().read_cursors(std::move(names));
        if (read) cursor_at_start = read->front();
        std::vector<std::pair<std::string, std::string>> values{
            {"recording.cursor", std::to_string(calls.size())}};
        co_await host->runtime().write_cursors(std::move(values));
        auto m = message("recorded", "from the channel", "recording-1");
        auto r = co_await host->runtime().accept(std::move(m));
        if (auto* a = (r ? &*r : nullptr)) turn_id = a->turn_id;
    }
    asio::awaitable<void> stop() override {
        calls.push_back("stop");
        co_return;
    }
    asio::awaitable<void> close() override {
        calls.push_back("close");
        co_return;
    }
};
} // namespace

BOOST_FIXTURE_TEST_CASE(a_channel_of_ones_own_lives_with_the_service, service_fixture) {
    auto dir = std::filesystem::temp_directory_path() / ("baton-service-" + make_turn_id());
    auto o = sqlite_options(dir);
    std::string first_turn;
    for (int run = 0; run < 2; ++run) {
        service svc(io.get_executor(), o);
        auto ch = std::make_shared<recording_channel>();
        svc.add_channel(ch);
        BOOST_TEST(ch->calls.empty()); // nothing happens before async_start
        auto started = svc.async_start(asio::use_future);
        get(started);
        BOOST_TEST((ch->calls == std::vector<std::string>{"attach", "start"}));
        if (run == 0) {
            BOOST_TEST(!ch->cursor_at_start);
            first_turn = ch->turn_id;
        } else {
            // The cursor survived the restart; the same idempotency key gave the same turn.
            BOOST_TEST(ch->cursor_at_start.value_or("") == "2");
            BOOST_TEST(ch->turn_id == first_turn);
        }
        auto waited = svc.async_wait_turn(ch->turn_id, asio::use_future);
        BOOST_TEST(*get(waited).reply == "echo: from the channel");
        auto stopped = svc.async_stop(asio::use_future);
        get(stopped);
        BOOST_TEST((ch->calls == std::vector<std::string>{"attach", "start", "stop", "close"}));
    }
    std::filesystem::remove_all(dir);
}

namespace {
// Records its life in a shared list; throws from attach or start when told to.
struct failing_channel : channel {
    failing_channel(std::string n, std::string fail, std::vector<std::string>& log)
        : name_(std::move(n)), fail_(std::move(fail)), log_(log) {}
    std::string name_, fail_;
    std::vector<std::string>& log_;
    std::string_view name() const override { return name_; }
    void step(const char* what) {
        log_.push_back(name_ + "." + what);
        if (fail_ == what) throw std::invalid_argument(name_ + " cannot " + what);
    }
    void attach(channel_host&) override { step("attach"); }
    asio::awaitable<void> start() override {
        step("start");
        co_return;
    }
    asio::awaitable<void> stop() override {
        step("stop");
        co_return;
    }
    asio::awaitable<void> close() override {
        step("close");
        co_return;
    }
};
} // namespace

// A start that fails part way is stopped as far as it went: a channel is stopped only if it was
// started, closed only if it was attached; one never attached is left alone.
BOOST_FIXTURE_TEST_CASE(a_failed_start_is_stopped_as_far_as_it_went, service_fixture) {
    for (std::string fail : {"attach", "start"}) {
        std::vector<std::string> log;
        service svc(io.get_executor(), memory_options());
        svc.add_channel(std::make_shared<failing_channel>("a", "", log));
        svc.add_channel(std::make_shared<failing_channel>("b", fail, log));
        svc.add_channel(std::make_shared<failing_channel>("c", "", log));
        diagnostics diag;
        std::promise<error_code> started;
        svc.async_start(diag, [&](error_code ec) { started.set_value(ec); });
        auto sf = started.get_future();
        BOOST_TEST((get(sf) == errc::invalid_config));
        BOOST_TEST(diag.message().find("b cannot " + fail) != std::string::npos, diag.message());
        BOOST_TEST(!svc.running());
        auto stopped = svc.async_stop(asio::use_future);
        get(stopped);
        std::vector<std::string> want;
        if (fail == "attach")
            want = {"a.attach", "b.attach", "a.close"};
        else
            want = {"a.attach", "b.attach", "c.attach", "a.start", "b.start",
                    "a.stop",   "a.close",  "b.close",  "c.close"};
        BOOST_TEST(log == want, boost::test_tools::per_element());
    }
}

// What a channel gets from runtime::accept: a boost::system::result, whose value() throws the
// refusal with its errc.
BOOST_FIXTURE_TEST_CASE(runtime_accept_is_a_result, service_fixture) {
    service svc(io.get_executor(), memory_options());
    auto started = svc.async_start(asio::use_future);
    get(started);
    auto m = message("s1", "hi");
    m.agent = "nonesuch";
    auto f = asio::co_spawn(io, svc.runtime().accept(std::move(m)), asio::use_future);
    auto r = get(f);
    BOOST_TEST_REQUIRE(!r);
    BOOST_TEST((r.error().code == errc::invalid_request));
    BOOST_TEST(r.error().message == "unknown agent: nonesuch");
    try {
        (void)r.value();
        BOOST_FAIL("value() of a refusal returned");
    } catch (const boost::system::system_error& e) {
        BOOST_TEST((e.code() == errc::invalid_request));
        BOOST_TEST(std::string(e.what()).find("unknown agent: nonesuch") != std::string::npos);
    }
    auto ok = asio::co_spawn(io, svc.runtime().accept(message("s1", "hi")), asio::use_future);
    auto r2 = get(ok);
    BOOST_TEST_REQUIRE(r2.has_value());
    BOOST_TEST(r2->session_id == "s1");
    BOOST_TEST(r2.value().turn_id == r2->turn_id);
    auto stopped = svc.async_stop(asio::use_future);
    get(stopped);
}

// A cancellation that races the end of an operation run on another strand (the wait's, the HTTP
// client's): Boost 1.81's co_spawn forwarding used a signal freed by then. Two threads, many
// rounds; ASan and TSan catch a use after free, and every operation must still complete once.
BOOST_AUTO_TEST_CASE(cancellation_racing_the_end_is_dropped) {
    constexpr int rounds = 3000;
    asio::io_context io{2};
    std::vector<std::unique_ptr<asio::cancellation_signal>> signals;
    std::atomic<int> completed{0};
    for (int i = 0; i < rounds; ++i) {
        auto a = detail::make_thin_strand(io.get_executor());
        auto b = detail::make_thin_strand(io.get_executor());
        auto& sig = *signals.emplace_back(std::make_unique<asio::cancellation_signal>());
        auto child = []() -> asio::awaitable<int> { co_return 1; };
        auto parent = [](asio::any_io_executor on, asio::awaitable<int> op) -> asio::awaitable<int> {
            co_return co_await detail::run_on(std::move(on), std::move(op));
        };
        asio::co_spawn(a, parent(b, child()),
                       asio::bind_cancellation_slot(sig.slot(), [&completed](std::exception_ptr, int) {
                           completed.fetch_add(1);
                       }));
        asio::post(a, [&sig] { sig.emit(asio::cancellation_type::terminal); });
    }
    std::thread other([&] { io.run(); });
    io.run();
    other.join();
    BOOST_TEST(completed.load() == rounds);
}

BOOST_AUTO_TEST_SUITE_END()
