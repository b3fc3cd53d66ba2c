// The turn's stages, hook ordering and the seed's failure boundaries, one test each.
#include "tests/test_util.hpp"

#include <baton/pipeline.hpp>
#include <baton/framework.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

using namespace baton;
using namespace baton::test;

namespace {

// Counts calls so a test can prove the model was (not) run.
class counting_model : public model_client {
public:
    std::atomic<int> calls{0};
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        ++calls;
        chat_completion c;
        c.text = "echo: " + req.messages.back().content;
        c.finish_reason = "stop";
        c.prompt_tokens = 1;
        c.completion_tokens = 2;
        c.has_usage = true;
        co_return c;
    }
    std::string name() const override { return "counting"; }
};

struct framework_fixture : io_fixture {
    std::shared_ptr<store> mem = make_memory_store();
    store_runner db{mem};
    framework fw{db, make_default_plugin(db)};
    std::shared_ptr<counting_model> model = std::make_shared<counting_model>();
    std::vector<std::string> saves;
    std::vector<std::string> errors; // "stage" per on_error call

    framework_fixture() {
        agent a;
        a.config.name = "default";
        a.model = model;
        fw.add_agent(a);
        plugin observer;
        observer.name = "observer";
        observer.save_state = [this](turn_context&) -> asio::awaitable<void> {
            saves.push_back("observer");
            co_return;
        };
        observer.on_error = [this](std::string_view stage, std::exception_ptr, const inbound&) {
            errors.emplace_back(stage);
        };
        fw.register_plugin(observer);
    }

    inbound message(std::string text, std::string sid = "s1") {
        inbound in;
        in.session_id = std::move(sid);
        in.text = std::move(text);
        return in;
    }

    turn_result run(inbound in) { return run_bounded(ctx, fw.process_inbound(std::move(in))); }
};

plugin failing_stage(const std::string& stage) {
    plugin p;
    p.name = "fails-" + stage;
    auto boom = [stage]() { throw std::runtime_error(stage + " exploded"); };
    if (stage == "resolve_session")
        p.resolve_session = [boom](turn_context&) -> asio::awaitable<std::optional<std::string>> {
            boom();
            co_return std::nullopt;
        };
    if (stage == "load_state")
        p.load_state = [boom](turn_context&) -> asio::awaitable<std::optional<json::object>> {
            boom();
            co_return std::nullopt;
        };
    if (stage == "build_prompt")
        p.build_prompt = [boom](turn_context&) -> asio::awaitable<std::optional<prompt>> {
            boom();
            co_return std::nullopt;
        };
    if (stage == "run_model")
        p.run_model = [boom](turn_context&,
                             const prompt&) -> asio::awaitable<std::optional<model_output>> {
            boom();
            co_return std::nullopt;
        };
    return p;
}

} // namespace

BOOST_AUTO_TEST_SUITE(framework_turn)

BOOST_FIXTURE_TEST_CASE(stages_run_in_order_and_the_echo_reply_is_saved, framework_fixture) {
    std::vector<std::string> order;
    plugin tracer;
    tracer.resolve_session = [&](turn_context&) -> asio::awaitable<std::optional<std::string>> {
        order.push_back("resolve_session");
        co_return std::nullopt;
    };
    tracer.load_state = [&](turn_context&) -> asio::awaitable<std::optional<json::object>> {
        order.push_back("load_state");
        co_return std::nullopt;
    };
    tracer.build_prompt = [&](turn_context&) -> asio::awaitable<std::optional<prompt>> {
        order.push_back("build_prompt");
        co_return std::nullopt;
    };
    tracer.run_model = [&](turn_context&,
                           const prompt&) -> asio::awaitable<std::optional<model_output>> {
        order.push_back("run_model");
        co_return std::nullopt;
    };
    tracer.save_state = [&](turn_context&) -> asio::awaitable<void> {
        order.push_back("save_state");
        co_return;
    };
    tracer.render_outbound = [&](turn_context&) -> asio::awaitable<std::vector<outbound>> {
        order.push_back("render_outbound");
        co_return std::vector<outbound>{};
    };
    tracer.dispatch_outbound = [&](turn_context&, const outbound&) -> asio::awaitable<bool> {
        order.push_back("dispatch_outbound");
        co_return false;
    };
    fw.register_plugin(tracer);
    auto r = run(message("hello"));
    BOOST_TEST(r.reply == "echo: hello");
    BOOST_TEST(r.steps == 1);
    BOOST_TEST(r.usage.completion_tokens == 2);
    std::vector<std::string> expected{"resolve_session",  "load_state", "build_prompt",
                                      "run_model",        "save_state", "render_outbound",
                                      "dispatch_outbound"};
    BOOST_TEST(order == expected, boost::test_tools::per_element());
    auto tape = mem->read_tape("s1", 0, 10);
    BOOST_REQUIRE_EQUAL(tape.size(), 2u);
    BOOST_TEST(tape[0].id == 1);
    BOOST_TEST(tape[1].id == 2);
    BOOST_TEST(tape[1].payload.at("text").as_string() == "echo: hello");
}

BOOST_FIXTURE_TEST_CASE(model_error_still_runs_save_state_and_propagates, framework_fixture) {
    fw.register_plugin(failing_stage("run_model"));
    BOOST_CHECK_THROW(run(message("hello")), std::runtime_error);
    BOOST_TEST(saves.size() == 1u);
    BOOST_TEST(errors == std::vector<std::string>{"run_model"}, boost::test_tools::per_element());
    // The user's message and the error reach the tape through save_state.
    auto tape = mem->read_tape("s1", 0, 10);
    BOOST_REQUIRE_EQUAL(tape.size(), 2u);
    BOOST_TEST((tape[1].kind == tape_kind::error));
}

BOOST_FIXTURE_TEST_CASE(cancellation_during_run_model_still_runs_save_state, framework_fixture) {
    bool save_awaited = false;
    plugin slow;
    slow.run_model = [](turn_context&, const prompt&) -> asio::awaitable<std::optional<model_output>> {
        asio::steady_timer t(co_await asio::this_coro::executor, 30s);
        co_await t.async_wait(asio::use_awaitable);
        co_return model_output{"late", 1, {}};
    };
    // A save that itself awaits: it must not be cancelled by the turn's cancellation.
    slow.save_state = [&](turn_context&) -> asio::awaitable<void> {
        asio::steady_timer t(co_await asio::this_coro::executor, 5ms);
        co_await t.async_wait(asio::use_awaitable);
        save_awaited = true;
    };
    fw.register_plugin(slow);

    asio::cancellation_signal cancel;
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(ctx, fw.process_inbound(message("hello")),
                   asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, turn_result) {
                       error = e;
                       done = true;
                   }));
    asio::steady_timer trigger(ctx, 20ms);
    trigger.async_wait(
        [&](boost::system::error_code) { cancel.emit(asio::cancellation_type::terminal); });
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!done && std::chrono::steady_clock::now() < deadline)
        ctx.run_one_for(10ms);
    BOOST_REQUIRE(done);
    BOOST_REQUIRE(error);
    BOOST_CHECK_EXCEPTION(std::rethrow_exception(error), boost::system::system_error,
                          [](const auto& e) { return e.code() == asio::error::operation_aborted; });
    BOOST_TEST(save_awaited);
    BOOST_TEST(saves.size() == 1u);
    BOOST_TEST(errors == std::vector<std::string>{"run_model"}, boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(failure_before_run_model_skips_save_state, framework_fixture) {
    for (std::string stage : {"resolve_session", "load_state", "build_prompt"}) {
        framework_fixture f;
        f.fw.register_plugin(failing_stage(stage));
        BOOST_CHECK_THROW(f.run(f.message("hello")), std::runtime_error);
        BOOST_TEST(f.saves.empty(), stage << ": save_state must not run");
        BOOST_TEST(f.errors == std::vector<std::string>{stage}, boost::test_tools::per_element());
        BOOST_TEST(f.model->calls.load() == 0);
        BOOST_TEST(f.mem->read_tape("s1", 0, 10).empty());
    }
}

BOOST_FIXTURE_TEST_CASE(on_error_observes_and_the_error_propagates, framework_fixture) {
    int seen = 0;
    plugin second_observer;
    second_observer.on_error = [&](std::string_view, std::exception_ptr e, const inbound& in) {
        ++seen;
        BOOST_TEST(in.text == "hello");
        BOOST_CHECK_THROW(std::rethrow_exception(e), std::runtime_error);
        throw std::logic_error("an observer that throws must not replace the error");
    };
    fw.register_plugin(second_observer);
    fw.register_plugin(failing_stage("build_prompt"));
    BOOST_CHECK_THROW(run(message("hello")), std::runtime_error);
    BOOST_TEST(seen == 1);
    BOOST_TEST(errors.size() == 1u);
}

BOOST_FIXTURE_TEST_CASE(direct_command_completes_without_a_model_run, framework_fixture) {
    auto r = run(message("/help"));
    BOOST_TEST(model->calls.load() == 0);
    BOOST_TEST(r.steps == 0);
    BOOST_TEST(r.direct_command);
    BOOST_TEST(r.reply.find("/help") != std::string::npos);
    BOOST_TEST(saves.size() == 1u);
    auto m = run(message("/model"));
    // A client of the program's own is named by itself, not by the config's defaults (echo).
    BOOST_TEST(m.reply == "agent default uses counting", m.reply);
    BOOST_TEST(model->calls.load() == 0);
}

BOOST_FIXTURE_TEST_CASE(reset_starts_the_context_at_a_new_anchor, framework_fixture) {
    std::vector<std::size_t> prompt_sizes;
    plugin spy;
    spy.build_prompt = [](turn_context&) -> asio::awaitable<std::optional<prompt>> {
        co_return std::nullopt;
    };
    spy.run_model = [&](turn_context&, const prompt& p) -> asio::awaitable<std::optional<model_output>> {
        prompt_sizes.push_back(p.messages.size());
        co_return std::nullopt; // fall through to the default
    };
    fw.register_plugin(spy);
    run(message("one"));
    run(message("two"));
    run(message("/reset"));
    run(message("three"));
    std::vector<std::size_t> expected{1, 3, 1};
    BOOST_TEST(prompt_sizes == expected, boost::test_tools::per_element());
    auto tape = mem->read_tape("s1", 0, 100);
    BOOST_TEST(tape.size() == 9u); // nothing is deleted by a reset
}

BOOST_FIXTURE_TEST_CASE(last_registered_hook_takes_the_first_result, framework_fixture) {
    auto fixed = [](std::string reply) {
        plugin p;
        p.run_model = [reply](turn_context&,
                              const prompt&) -> asio::awaitable<std::optional<model_output>> {
            co_return model_output{reply, 1, {}};
        };
        return p;
    };
    fw.register_plugin(fixed("first"));
    fw.register_plugin(fixed("second"));
    BOOST_TEST(run(message("x")).reply == "second");
    BOOST_TEST(model->calls.load() == 0);
}

BOOST_FIXTURE_TEST_CASE(load_state_merges_with_higher_priority_winning, framework_fixture) {
    auto state = [](json::object o) {
        plugin p;
        p.load_state = [o](turn_context&) -> asio::awaitable<std::optional<json::object>> {
            co_return o;
        };
        return p;
    };
    fw.register_plugin(state({{"a", 1}, {"b", 1}}));
    fw.register_plugin(state({{"b", 2}, {"c", 2}}));
    json::object seen;
    plugin spy;
    spy.build_prompt = [&](turn_context& ctx) -> asio::awaitable<std::optional<prompt>> {
        seen = ctx.session_state;
        co_return std::nullopt;
    };
    fw.register_plugin(spy);
    run(message("x"));
    BOOST_TEST(seen.at("a").as_int64() == 1);
    BOOST_TEST(seen.at("b").as_int64() == 2);
    BOOST_TEST(seen.at("c").as_int64() == 2);
    // save_state persisted the merged state: the next turn's default load_state restores it.
    auto rec = mem->get_session("s1");
    BOOST_REQUIRE(rec);
    BOOST_TEST(rec->state.at("b").as_int64() == 2);
}

BOOST_FIXTURE_TEST_CASE(render_concatenates_and_dispatch_runs_per_item, framework_fixture) {
    plugin extra;
    extra.render_outbound = [](turn_context&) -> asio::awaitable<std::vector<outbound>> {
        co_return std::vector<outbound>{{"audit", "log", "copy", 0}};
    };
    std::vector<std::string> dispatched;
    extra.dispatch_outbound = [&](turn_context&, const outbound& o) -> asio::awaitable<bool> {
        dispatched.push_back(o.channel + ":" + o.text);
        co_return o.channel == "audit"; // handles its own item, leaves the rest to the default
    };
    fw.register_plugin(extra);
    run(message("hi"));
    std::vector<std::string> expected{"audit:copy", "http:echo: hi"};
    BOOST_TEST(dispatched == expected, boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(save_state_runs_every_implementation, framework_fixture) {
    plugin second;
    second.save_state = [this](turn_context&) -> asio::awaitable<void> {
        saves.push_back("second");
        throw std::runtime_error("second save failed");
        co_return;
    };
    fw.register_plugin(second);
    BOOST_CHECK_THROW(run(message("hi")), std::runtime_error);
    std::vector<std::string> expected{"second", "observer"};
    BOOST_TEST(saves == expected, boost::test_tools::per_element());
    BOOST_TEST(mem->read_tape("s1", 0, 10).size() == 2u); // the default save still ran
    BOOST_TEST(errors == std::vector<std::string>{"save_state"}, boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(turn_state_refuses_runtime_keys_from_plugins, framework_fixture) {
    bool refused = false, accepted = false;
    std::string turn_id, session_id;
    std::size_t keys = 0;
    plugin writer;
    writer.build_prompt = [&](turn_context& ctx) -> asio::awaitable<std::optional<prompt>> {
        refused = !ctx.state.set("_runtime_turn_id", "forged");
        accepted = ctx.state.set("mine", 42);
        turn_id = ctx.state.get("_runtime_turn_id")->as_string().c_str();
        session_id = ctx.state.data().at("_runtime_session_id").as_string().c_str();
        keys = ctx.state.data().size();
        co_return std::nullopt;
    };
    fw.register_plugin(writer);
    auto in = message("x");
    in.turn_id = "t_fixed";
    auto r = run(in);
    BOOST_TEST(refused);
    BOOST_TEST(accepted);
    BOOST_TEST(turn_id == "t_fixed");
    BOOST_TEST(session_id == r.session_id);
    BOOST_TEST(keys == 3u); // the two runtime keys and "mine"
}

BOOST_FIXTURE_TEST_CASE(session_is_derived_from_channel_and_chat, framework_fixture) {
    inbound in;
    in.channel = "telegram";
    in.chat_id = "42";
    in.text = "hi";
    auto r = run(in);
    BOOST_TEST(r.session_id == "telegram:42");
    inbound none;
    none.text = "hi";
    BOOST_CHECK_THROW(run(none), turn_error);
}

BOOST_AUTO_TEST_SUITE_END()
