// The agent loop through the embedded runtime: tools, allow-lists, validation, timeouts, hooks and
// every turn outcome, against a scripted model (the HTTP client has its own suite).
#include "tests/test_util.hpp"

#include <baton/pipeline.hpp>
#include <baton/runtime.hpp>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <deque>
#include <mutex>
#include <thread>

using namespace baton;
using namespace baton::test;

namespace {

struct scripted_reply {
    chat_completion completion;
    std::chrono::milliseconds delay{0};
    bool fail = false;               // throw model_error
    std::vector<std::string> deltas; // streamed first, as text deltas
};

// Answers from a script; once it runs out, repeats the last entry.
class scripted_model : public model_client {
public:
    std::mutex m;
    std::deque<scripted_reply> script;
    std::vector<model_request> requests;

    asio::awaitable<chat_completion> complete(const model_request& req,
                                              const delta_handler& on_delta) override {
        scripted_reply r;
        {
            std::lock_guard lock(m);
            requests.push_back(req);
            r = script.front();
            if (script.size() > 1) script.pop_front();
        }
        if (r.delay.count() > 0) {
            asio::steady_timer t(co_await asio::this_coro::executor, r.delay);
            co_await t.async_wait(asio::use_awaitable);
        }
        for (const auto& d : r.deltas) {
            model_delta piece;
            piece.text = d;
            if (on_delta) on_delta(piece);
        }
        if (r.fail) throw turn_error("model_error", "scripted failure");
        co_return r.completion;
    }
    std::string name() const override { return "scripted"; }
};

chat_completion text(std::string t) {
    chat_completion c;
    c.text = std::move(t);
    c.finish_reason = "stop";
    c.prompt_tokens = 10;
    c.completion_tokens = 3;
    return c;
}

chat_completion calls(std::vector<tool_call> tc) {
    chat_completion c;
    c.tool_calls = std::move(tc);
    c.finish_reason = "tool_calls";
    c.prompt_tokens = 5;
    c.completion_tokens = 1;
    return c;
}

json::object schema_with(json::object props, json::array required = {}) {
    return {{"type", "object"}, {"properties", std::move(props)}, {"required", std::move(required)}};
}

struct loop_fixture {
    asio::io_context ctx;
    std::shared_ptr<store> mem = make_memory_store();
    store_runner db{mem};
    framework fw{db, make_default_plugin(db)};
    std::shared_ptr<scripted_model> model = std::make_shared<scripted_model>();
    runtime rt{ctx.get_executor(), fw};
    asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
    std::vector<std::thread> threads;
    std::mutex tool_mutex;
    int tools_active = 0, tools_max_active = 0;

    explicit loop_fixture(limits_config limits = {}) {
        agent a;
        a.config.tools = {"clock", "add", "sleepy", "crash"};
        a.config.limits = limits;
        a.model = model;
        fw.add_agent(a);
        fw.tools().add(make_function_tool(
            {"add", "adds two integers",
             schema_with({{"a", {{"type", "integer"}}}, {"b", {{"type", "integer"}}}}, {"a", "b"})},
            [](json::object args, tool_context&) -> asio::awaitable<tool_result> {
                co_return tool_result{true,
                                      std::to_string(args.at("a").as_int64() + args.at("b").as_int64())};
            }));
        fw.tools().add(make_function_tool(
            {"sleepy", "waits", schema_with({{"ms", {{"type", "integer"}}}})},
            [this](json::object args, tool_context&) -> asio::awaitable<tool_result> {
                {
                    std::lock_guard lock(tool_mutex);
                    tools_max_active = std::max(tools_max_active, ++tools_active);
                }
                auto ms = args.contains("ms") ? args.at("ms").as_int64() : 50;
                asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
                boost::system::error_code ec;
                co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
                {
                    std::lock_guard lock(tool_mutex);
                    --tools_active;
                }
                if (ec) throw boost::system::system_error(ec);
                co_return tool_result{true, "slept"};
            }));
        fw.tools().add(
            make_function_tool({"crash", "throws", schema_with({})},
                               [](json::object, tool_context&) -> asio::awaitable<tool_result> {
                                   throw std::runtime_error("the tool fell over");
                                   co_return tool_result{};
                               }));
        fw.tools().add(
            make_function_tool({"secret", "not allowed", schema_with({})},
                               [](json::object, tool_context&) -> asio::awaitable<tool_result> {
                                   co_return tool_result{true, "leaked"};
                               }));
        for (int i = 0; i < 2; ++i)
            threads.emplace_back([this] { ctx.run(); });
    }
    ~loop_fixture() {
        work.reset();
        ctx.stop();
        for (auto& t : threads)
            t.join();
    }

    void script(std::vector<scripted_reply> s) {
        std::lock_guard lock(model->m);
        model->script.assign(s.begin(), s.end());
    }

    std::string post(std::string text, std::string sid = "s1") {
        accept_request r;
        r.session_id = std::move(sid);
        r.text = std::move(text);
        auto res = asio::co_spawn(ctx, rt.accept(std::move(r)), asio::use_future).get();
        BOOST_REQUIRE(res.has_value());
        return (*res).turn_id;
    }

    std::optional<turn_record> turn(const std::string& tid) {
        return asio::co_spawn(ctx, rt.get_turn(tid), asio::use_future).get();
    }

    turn_record wait(const std::string& tid, std::chrono::milliseconds limit = 10s) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        for (;;) {
            auto t = turn(tid);
            if (t && is_terminal(t->status)) return *t;
            BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "turn did not finish");
            std::this_thread::sleep_for(2ms);
        }
    }

    std::vector<tape_entry> tape(std::string sid = "s1") { return mem->read_tape(sid, 0, 1000); }
};

tool_call call(std::string id, std::string name, std::string args) {
    return {std::move(id), std::move(name), std::move(args)};
}

} // namespace

BOOST_AUTO_TEST_SUITE(agent_loop)

BOOST_AUTO_TEST_CASE(tool_call_then_answer_completes_in_two_steps) {
    loop_fixture f;
    f.script({{calls({call("c1", "add", R"({"a":2,"b":3})")})}, {text("2 + 3 = 5")}});
    auto t = f.wait(f.post("what is 2+3?"));
    BOOST_TEST((t.status == turn_status::completed));
    BOOST_TEST(t.steps == 2);
    BOOST_TEST(*t.reply == "2 + 3 = 5");
    BOOST_TEST(t.usage.prompt_tokens == 15);
    // The second request carried the tool's observation; the first offered the allowed tools only.
    BOOST_REQUIRE_EQUAL(f.model->requests.size(), 2u);
    const auto& second = f.model->requests[1].messages;
    BOOST_TEST(second.back().role == "tool");
    BOOST_TEST(second.back().content == "5");
    BOOST_TEST(second.back().tool_call_id == "c1");
    std::vector<std::string> offered;
    for (auto& s : f.model->requests[0].tools)
        offered.push_back(s.name);
    BOOST_TEST(offered == (std::vector<std::string>{"clock", "add", "sleepy", "crash"}),
               boost::test_tools::per_element());
    auto tape = f.tape();
    BOOST_REQUIRE_EQUAL(tape.size(), 4u);
    BOOST_TEST((tape[1].kind == tape_kind::tool_call));
    BOOST_TEST((tape[2].kind == tape_kind::tool_result));
    BOOST_TEST(tape[2].payload.at("output").as_string() == "5");
    BOOST_TEST(tape[2].payload.at("ok").as_bool());
}

BOOST_AUTO_TEST_CASE(disallowed_and_invalid_calls_become_error_observations) {
    loop_fixture f;
    f.script({{calls({call("c1", "secret", "{}"), call("c2", "add", R"({"a":"two","b":3})"),
                      call("c3", "add", R"({"a":1})"), call("c4", "add", "not json")})},
              {text("sorry")}});
    auto t = f.wait(f.post("try"));
    BOOST_TEST((t.status == turn_status::completed));
    const auto& msgs = f.model->requests.at(1).messages;
    BOOST_REQUIRE_GE(msgs.size(), 4u);
    auto obs = [&](std::size_t back) { return msgs[msgs.size() - back].content; };
    BOOST_TEST(obs(4).find("not available") != std::string::npos);
    BOOST_TEST(obs(3).find("a: expected integer") != std::string::npos);
    BOOST_TEST(obs(2).find("b: required") != std::string::npos);
    BOOST_TEST(obs(1).find("not valid JSON") != std::string::npos);
    for (auto& e : f.tape())
        if (e.kind == tape_kind::tool_result) BOOST_TEST(!e.payload.at("ok").as_bool());
}

BOOST_AUTO_TEST_CASE(step_limiter_ends_the_turn_with_step_limit) {
    limits_config l;
    l.max_steps = 3;
    loop_fixture f(l);
    f.script({{calls({call("c", "sleepy", R"({"ms":1})")})}});
    auto t = f.wait(f.post("loop forever"));
    BOOST_TEST((t.status == turn_status::step_limit));
    BOOST_TEST(t.steps == 3);
    BOOST_TEST(!t.reply); // no text at all: null, not ""
    BOOST_TEST(f.model->requests.size() == 3u);
    // The last step's calls are not run (no step is left to read their results), but each has
    // a result on the tape saying so, and the step_limit event ends it.
    auto tape = f.tape();
    int results = 0, not_run = 0;
    for (auto& e : tape) {
        if (e.kind != tape_kind::tool_result) continue;
        ++results;
        if (e.payload.at("output").as_string().starts_with("not run: the turn reached its step limit")) {
            ++not_run;
            BOOST_TEST(!e.payload.at("ok").as_bool());
        }
    }
    BOOST_TEST(results == 3);
    BOOST_TEST(not_run == 1);
    BOOST_TEST(f.tools_max_active == 1);
    BOOST_TEST((tape.back().kind == tape_kind::event));
    // The next turn's request is one a server takes: every call answered.
    f.script({{text("ok")}});
    BOOST_TEST((f.wait(f.post("and now?")).status == turn_status::completed));
    const auto& msgs = f.model->requests.back().messages;
    std::size_t calls_made = 0, answers = 0;
    for (const auto& m : msgs) {
        calls_made += m.tool_calls.size();
        answers += m.role == "tool";
    }
    BOOST_TEST(calls_made == 3u);
    BOOST_TEST(answers == 3u);
}

// A turn stopped while its tools run leaves a result for each call: a call without one would make
// the session's every later request one that OpenAI-compatible servers refuse.
BOOST_AUTO_TEST_CASE(a_turn_stopped_in_its_tools_leaves_every_call_answered) {
    // One call at a time: `b` has ended (its result is kept) when `a` sleeps and `c` waits.
    limits_config l;
    l.max_parallel_tools = 1;
    loop_fixture f(l);
    f.script({{calls({call("b", "add", R"({"a":1,"b":2})"), call("a", "sleepy", R"({"ms":5000})"),
                      call("c", "add", R"({"a":2,"b":2})")})}});
    auto tid = f.post("slow tools");
    auto deadline = std::chrono::steady_clock::now() + 5s;
    auto active = [&f] {
        std::lock_guard lock(f.tool_mutex);
        return f.tools_active;
    };
    while (active() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(2ms);
    BOOST_REQUIRE(active() == 1);
    BOOST_TEST(!asio::co_spawn(f.ctx, f.rt.cancel(tid), asio::use_future).get());
    auto t = f.wait(tid);
    BOOST_TEST((t.status == turn_status::stopped));
    BOOST_TEST(t.steps == 1);
    auto tape = f.tape();
    // user, three calls, three results, the error entry.
    BOOST_REQUIRE_EQUAL(tape.size(), 8u);
    BOOST_TEST((tape[4].kind == tape_kind::tool_result));
    BOOST_TEST(tape[4].payload.at("output").as_string() == "3"); // it had ended: kept
    BOOST_TEST(tape[4].payload.at("ok").as_bool());
    for (std::size_t i : {5u, 6u}) {
        BOOST_TEST((tape[i].kind == tape_kind::tool_result));
        BOOST_TEST(!tape[i].payload.at("ok").as_bool());
        BOOST_TEST(tape[i].payload.at("output").as_string() ==
                   "no result: the turn ended before the call returned");
    }
    BOOST_TEST((tape[7].kind == tape_kind::error));

    f.script({{text("fine")}});
    BOOST_TEST((f.wait(f.post("hello again")).status == turn_status::completed));
    const auto& msgs = f.model->requests.back().messages;
    std::vector<std::string> answered;
    for (const auto& m : msgs)
        if (m.role == "tool") answered.push_back(m.tool_call_id);
    BOOST_TEST((answered == std::vector<std::string>{"b", "a", "c"}));
}

// A tape written before every call got a result (or by a hook) may hold a call without one; the
// context answers it, so that the session's next request is one a server takes.
BOOST_AUTO_TEST_CASE(a_call_without_a_result_on_the_tape_is_answered_in_the_context) {
    loop_fixture f;
    state_update u;
    u.session_id = "old";
    u.entries.push_back(make_message("user", "run it"));
    u.entries.push_back(
        make_entry(tape_kind::tool_call, {{"call_id", "x"}, {"name", "clock"}, {"arguments", "{}"}}));
    u.entries.push_back(make_error_entry("stopped", "the turn was stopped"));
    f.mem->save_state(u);
    f.script({{text("fine")}});
    BOOST_TEST((f.wait(f.post("hello again", "old")).status == turn_status::completed));
    const auto& msgs = f.model->requests.back().messages;
    std::size_t i = 0;
    while (i < msgs.size() && msgs[i].tool_calls.empty())
        ++i;
    BOOST_REQUIRE(i + 2 < msgs.size());
    BOOST_TEST(msgs[i + 1].role == "tool");
    BOOST_TEST(msgs[i + 1].tool_call_id == "x");
    BOOST_TEST(msgs[i + 1].content == "no result: the turn ended before the call returned");
    BOOST_TEST(msgs.back().content == "hello again");
}

BOOST_AUTO_TEST_CASE(parallel_tool_calls_run_concurrently_up_to_the_limit) {
    for (std::int64_t width : {1, 3}) {
        limits_config l;
        l.max_parallel_tools = width;
        loop_fixture f(l);
        f.script({{calls({call("a", "sleepy", R"({"ms":80})"), call("b", "sleepy", R"({"ms":80})"),
                          call("c", "sleepy", R"({"ms":80})")})},
                  {text("done")}});
        auto t = f.wait(f.post("sleep"));
        BOOST_TEST((t.status == turn_status::completed));
        BOOST_TEST(f.tools_max_active == width);
    }
}

BOOST_AUTO_TEST_CASE(a_slow_tool_times_out_into_an_error_observation) {
    limits_config l;
    l.tool_timeout = 50ms;
    loop_fixture f(l);
    f.script({{calls({call("a", "sleepy", R"({"ms":5000})")})}, {text("gave up")}});
    auto t = f.wait(f.post("sleep"));
    BOOST_TEST((t.status == turn_status::completed));
    BOOST_TEST(f.model->requests.at(1).messages.back().content.find("timed out") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_tool_crash_fails_the_turn_with_tool_error) {
    loop_fixture f;
    f.script({{calls({call("a", "crash", "{}")})}, {text("unreachable")}});
    auto t = f.wait(f.post("crash"));
    BOOST_TEST((t.status == turn_status::failed));
    BOOST_REQUIRE(t.error);
    BOOST_TEST(t.error->code == "tool_error");
    // save_state still ran: the user message, the call, its result (none) and the error are on
    // the tape.
    auto tape = f.tape();
    BOOST_REQUIRE_EQUAL(tape.size(), 4u);
    BOOST_TEST((tape[2].kind == tape_kind::tool_result));
    BOOST_TEST((tape[3].kind == tape_kind::error));
}

BOOST_AUTO_TEST_CASE(a_model_failure_fails_the_turn_with_model_error) {
    loop_fixture f;
    scripted_reply bad;
    bad.fail = true;
    f.script({bad});
    auto t = f.wait(f.post("hi"));
    BOOST_TEST((t.status == turn_status::failed));
    BOOST_TEST(t.error->code == "model_error");
}

BOOST_AUTO_TEST_CASE(the_turn_deadline_ends_it_timed_out_keeping_what_it_had) {
    limits_config l;
    l.turn_timeout = 150ms;
    loop_fixture f(l);
    auto slow_text = text("never");
    f.script({{calls({call("a", "add", R"({"a":1,"b":1})")})}, {slow_text, 10s}});
    auto t = f.wait(f.post("slow"));
    BOOST_TEST((t.status == turn_status::timed_out));
    BOOST_TEST(t.steps == 2);                      // the second call had begun
    BOOST_REQUIRE_EQUAL(f.tape().size(), 3u + 1u); // user, tool_call, tool_result, error: saved anyway
    BOOST_TEST(f.tape().back().payload.at("code").as_string() == "timed_out");
    // Said in words, not as Boost's error with its source location.
    BOOST_TEST(f.tape().back().payload.at("message").as_string() == "the turn ran past turn_timeout_ms");
}

BOOST_AUTO_TEST_CASE(cancel_stops_running_and_queued_turns) {
    loop_fixture f;
    f.script({{text("slow"), 10s}});
    auto running = f.post("first");
    auto queued = f.post("second");
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (f.rt.running_turns() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(1ms);
    auto q = asio::co_spawn(f.ctx, f.rt.cancel(queued), asio::use_future).get();
    BOOST_TEST(!q);
    auto r = asio::co_spawn(f.ctx, f.rt.cancel(running), asio::use_future).get();
    BOOST_TEST(!r);
    BOOST_TEST((f.wait(running).status == turn_status::stopped));
    BOOST_TEST((f.wait(queued).status == turn_status::stopped));
    BOOST_TEST(f.tape().back().payload.at("code").as_string() == "stopped");
    BOOST_TEST(f.tape().back().payload.at("message").as_string() == "the turn was stopped");
    BOOST_TEST(f.model->requests.size() == 1u); // the queued one never ran
    auto again = asio::co_spawn(f.ctx, f.rt.cancel(running), asio::use_future).get();
    BOOST_REQUIRE(again);
    BOOST_TEST((again->code == errc::turn_not_running));
    auto unknown = asio::co_spawn(f.ctx, f.rt.cancel(make_turn_id()), asio::use_future).get();
    BOOST_TEST((unknown->code == errc::not_found));
}

// "/stop now" and a tab before "/stop" were answered "stop requested" while the running turn went
// on: the runtime and the command stage parsed commands differently. One parser now.
BOOST_AUTO_TEST_CASE(stop_command_stops_the_running_turn) {
    for (std::string command : {"/stop", "/stop now", "\t/stop", " /stop \r\n", "/stop\tplease"}) {
        BOOST_TEST_CONTEXT(command) {
            loop_fixture f;
            f.script({{text("slow"), 10s}});
            auto running = f.post("first");
            auto deadline = std::chrono::steady_clock::now() + 5s;
            while (f.rt.running_turns() == 0 && std::chrono::steady_clock::now() < deadline)
                std::this_thread::sleep_for(1ms);
            auto stop = f.post(command);
            BOOST_TEST((f.wait(running).status == turn_status::stopped));
            auto s = f.wait(stop);
            BOOST_TEST((s.status == turn_status::completed));
            BOOST_TEST(s.steps == 0);
            BOOST_TEST(s.reply.value_or("").starts_with("stop requested"));
        }
    }
}

BOOST_AUTO_TEST_CASE(before_tool_call_can_deny_or_replace) {
    loop_fixture f;
    plugin guard;
    guard.before_tool_call = [](turn_context&, const tool_call& c) -> asio::awaitable<tool_decision> {
        if (c.id == "deny") co_return tool_decision{tool_decision::kind::deny, {false, "not today"}};
        if (c.id == "replace") co_return tool_decision{tool_decision::kind::replace, {true, "42"}};
        co_return tool_decision{};
    };
    int after = 0;
    guard.after_tool_call = [&](turn_context&, const tool_call&,
                                tool_result& r) -> asio::awaitable<void> {
        ++after;
        r.output += "!";
        co_return;
    };
    f.fw.register_plugin(guard);
    f.script(
        {{calls({call("deny", "add", R"({"a":1,"b":1})"), call("replace", "add", R"({"a":1,"b":1})")})},
         {text("ok")}});
    f.wait(f.post("go"));
    const auto& msgs = f.model->requests.at(1).messages;
    BOOST_TEST(msgs[msgs.size() - 2].content == "tool call denied: not today!");
    BOOST_TEST(msgs.back().content == "42!");
    BOOST_TEST(after == 2);
}

BOOST_AUTO_TEST_CASE(max_reply_bytes_clips_at_a_character_boundary) {
    limits_config l;
    l.max_reply_bytes = 4;
    loop_fixture f(l);
    f.script({{text("a\xc3\xa9\xc3\xa9")}}); // a é é: 5 bytes
    auto t = f.wait(f.post("x"));
    BOOST_TEST(*t.reply == "a\xc3\xa9");
}

BOOST_AUTO_TEST_CASE(a_failed_turn_keeps_its_streamed_text_cut_at_max_reply_bytes) {
    limits_config l;
    l.max_reply_bytes = 4;
    loop_fixture f(l);
    // a b c é z z, then the call fails: the text kept is cut as a completed reply would be, at
    // the character boundary below 4 bytes, and nothing after the cut joins it.
    scripted_reply r;
    r.deltas = {"ab", "c\xc3\xa9", "zz"};
    r.fail = true;
    f.script({r});
    auto t = f.wait(f.post("x"));
    BOOST_TEST((t.status == turn_status::failed));
    BOOST_TEST_REQUIRE(t.reply.has_value());
    BOOST_TEST(*t.reply == "abc");
}

BOOST_AUTO_TEST_SUITE_END()
