// One turn in this program's own io_context: a model (scripted here) calls a C++ tool, and a
// render_outbound hook of ours looks at the result. Prints the turn record; exit 0 if completed.
#include <baton/runtime.hpp>
#include <baton/tools.hpp>

#include <boost/asio.hpp>
#include <iostream>

namespace asio = boost::asio;
using namespace baton;

// Step 1 asks for `add`; step 2 answers with what the tool said.
struct scripted_model : model_client {
    asio::awaitable<chat_completion> complete(const model_request& req, const delta_handler&) override {
        chat_completion c;
        if (req.messages.back().role == "tool")
            c.text = "2 + 3 = " + req.messages.back().content;
        else
            c.tool_calls.push_back({"call_1", "add", R"({"a":2,"b":3})"});
        co_return c;
    }
    std::string name() const override { return "scripted"; }
};

asio::awaitable<int> run(runtime& rt) {
    accept_request req{.session_id = "demo", .text = "what is 2 + 3?"}; // named: GCC 12 coroutine bug
    auto r = co_await rt.accept(std::move(req));
    auto turn_id = std::get<accepted>(r).turn_id;
    for (asio::steady_timer t(co_await asio::this_coro::executor);;
         t.expires_after(std::chrono::milliseconds(5)), co_await t.async_wait(asio::use_awaitable))
        if (auto rec = co_await rt.get_turn(turn_id); rec && is_terminal(rec->status)) {
            std::cout << turn_json(*rec) << "\n";
            co_return rec->status == turn_status::completed ? 0 : 1;
        }
}

int main() {
    asio::io_context io;
    store_runner db(make_memory_store());
    framework fw(db);
    agent_config cfg;
    cfg.tools = {"add"};
    fw.add_agent({cfg, std::make_shared<scripted_model>()});
    tool_schema add{"add", "adds two integers", {{"type", "object"}}};
    fw.tools().add(
        make_function_tool(add, [](json::object a, tool_context&) -> asio::awaitable<tool_result> {
            co_return tool_result{true,
                                  std::to_string(a["a"].to_number<int>() + a["b"].to_number<int>())};
        }));
    std::string rendered; // what our render_outbound saw of the turn
    plugin watcher{.name = "watcher"};
    watcher.render_outbound = [&rendered](turn_context& ctx) -> asio::awaitable<std::vector<outbound>> {
        rendered = "rendered after " + std::to_string(ctx.output.steps) + " steps: " + ctx.output.reply;
        co_return std::vector<outbound>{}; // adds nothing: the default rendering stands
    };
    fw.register_plugin(watcher);
    runtime rt(io.get_executor(), fw);
    auto done = asio::co_spawn(io, run(rt), asio::use_future);
    io.run_for(std::chrono::seconds(10));
    std::cout << rendered << "\n";
    return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? done.get() : 2;
}
