// One turn in this program's own io_context, through baton::service: a model (scripted here)
// calls a C++ tool, and a render_outbound hook of ours looks at the result. Prints the turn
// record; exits 0 if the turn completed.
#include <baton/service.hpp>

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

asio::awaitable<int> run(service& svc) {
    co_await svc.async_start(asio::use_awaitable);
    accept_request msg{.session_id = "demo", .text = "what is 2 + 3?"}; // named: GCC 12 bug
    accepted a = co_await svc.async_submit(std::move(msg), asio::use_awaitable);
    turn_record rec = co_await svc.async_wait_turn(a.turn_id, asio::use_awaitable);
    std::cout << turn_json(rec) << "\n";
    co_await svc.async_stop(asio::use_awaitable);
    co_return rec.status == turn_status::completed ? 0 : 1;
}

int main() {
    asio::io_context io;
    service_options opts{.http = false}; // no listener: this program is the only client
    opts.config.storage.type = storage_config::kind::memory;
    service svc(io.get_executor(), opts);
    svc.add_agent({.name = "default", .tools = {"add"}}, std::make_shared<scripted_model>());
    svc.add_tool(make_function_tool({"add", "adds two integers", {{"type", "object"}}},
                                    [](json::object a, tool_context&) -> asio::awaitable<tool_result> {
                                        int sum = a["a"].to_number<int>() + a["b"].to_number<int>();
                                        co_return tool_result{true, std::to_string(sum)};
                                    }));
    svc.add_plugin({.name = "watcher",
                    .render_outbound = [](turn_context& ctx) -> asio::awaitable<std::vector<outbound>> {
                        std::cout << "rendered after " << ctx.output.steps
                                  << " steps: " << ctx.output.reply << "\n";
                        co_return std::vector<outbound>{}; // adds nothing: the default rendering stands
                    }});
    auto done = asio::co_spawn(io, run(svc), asio::use_future);
    io.run();
    return done.get();
}
