// Runs the tool calls of one step: allow-list, argument validation, before/after hooks, each
// call under tool_timeout_ms, up to max_parallel_tools at a time. A refused or invalid call is an
// error observation for the model; a tool that throws ends the turn (tool_error).
#include "pipeline/stages.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>

#include <algorithm>

namespace baton::pipeline {

namespace {
bool allowed(const turn_context& ctx, const std::string& name) {
    const auto& allow = ctx.agent->config.tools;
    return std::find(allow.begin(), allow.end(), name) != allow.end();
}

// The first to finish wins, failures included (the `||` operator would wait for a success).
asio::awaitable<tool_result> invoke_with_timeout(std::shared_ptr<tool> t, json::object args,
                                                 tool_context& tctx, std::chrono::milliseconds timeout) {
    auto ex = co_await asio::this_coro::executor;
    asio::steady_timer timer(ex, timeout);
    auto [order, error, result, timer_ec] =
        co_await asio::experimental::make_parallel_group(
            asio::co_spawn(ex, t->invoke(std::move(args), tctx), asio::deferred),
            timer.async_wait(asio::deferred))
            .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    if (order[0] == 1)
        co_return tool_result{false, "tool " + t->schema().name + " timed out after " +
                                         std::to_string(timeout.count()) + " ms"};
    if (error) std::rethrow_exception(error);
    co_return std::move(result);
}

asio::awaitable<tool_result> run_one(turn_context& ctx, const tool_call& call) {
    auto t = allowed(ctx, call.name) ? ctx.framework->tools().find(call.name) : nullptr;
    if (!t) co_return tool_result{false, "tool " + call.name + " is not available to this agent"};
    boost::system::error_code ec;
    json::value args = json::parse(call.arguments.empty() ? std::string_view("{}") : call.arguments, ec);
    if (ec)
        co_return tool_result{false,
                              "arguments of " + call.name + " are not valid JSON: " + ec.message()};
    if (auto problem = validate_arguments(t->schema().parameters, args))
        co_return tool_result{false, "invalid arguments for " + call.name + ": " + *problem};
    if (!args.is_object())
        co_return tool_result{false, "arguments of " + call.name + " must be a JSON object"};

    auto decision = co_await ctx.framework->before_tool_call(ctx, call);
    tool_result result;
    if (decision.action == tool_decision::kind::deny) {
        result = {false, "tool call denied: " + decision.result.output};
    } else if (decision.action == tool_decision::kind::replace) {
        result = std::move(decision.result);
    } else {
        tool_context tctx{ctx.session_id, ctx.inbound.turn_id, &ctx.state};
        try {
            result = co_await invoke_with_timeout(t, std::move(args.get_object()), tctx,
                                                  ctx.agent->config.limits.tool_timeout);
        } catch (const boost::system::system_error& e) {
            if (e.code() == asio::error::operation_aborted) throw;
            throw turn_error("tool_error", "tool " + call.name + " failed: " + e.what());
        } catch (const turn_error&) {
            throw;
        } catch (const std::exception& e) {
            throw turn_error("tool_error", "tool " + call.name + " failed: " + e.what());
        }
    }
    co_await ctx.framework->after_tool_call(ctx, call, result);
    co_return result;
}
} // namespace

asio::awaitable<void> run_tools(turn_context& ctx, const std::vector<tool_call>& calls,
                                std::vector<std::optional<tool_result>>& results) {
    results.assign(calls.size(), std::nullopt);
    // A turn that calls a tool is not run again after a crash: the store hears it first.
    if (!calls.empty() && ctx.inbound.progress && ctx.inbound.progress->deferred &&
        !ctx.inbound.progress->side_effects) {
        auto mark = [id = ctx.inbound.turn_id, folded = ctx.inbound.progress->folded](store& s) {
            s.mark_side_effects(id);
            for (const auto& f : folded)
                s.mark_side_effects(f);
        };
        co_await ctx.framework->db().run(std::move(mark));
        ctx.inbound.progress->side_effects = true;
    }
    auto width =
        static_cast<std::size_t>(std::max<std::int64_t>(1, ctx.agent->config.limits.max_parallel_tools));
    auto ex = co_await asio::this_coro::executor;
    for (std::size_t first = 0; first < calls.size(); first += width) {
        std::size_t last = std::min(calls.size(), first + width);
        using op_type = decltype(asio::co_spawn(ex, run_one(ctx, calls[first]), asio::deferred));
        std::vector<op_type> ops;
        for (std::size_t i = first; i < last; ++i)
            ops.push_back(asio::co_spawn(ex, run_one(ctx, calls[i]), asio::deferred));
        auto [order, errors, values] =
            co_await asio::experimental::make_parallel_group(std::move(ops))
                .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
        // The calls that ended keep their results, even when another failed or the turn stopped.
        std::exception_ptr failure;
        for (std::size_t i = first; i < last; ++i) {
            if (auto& e = errors[i - first])
                failure = failure ? failure : e;
            else
                results[i] = std::move(values[i - first]);
        }
        if (failure) std::rethrow_exception(failure);
    }
}

} // namespace baton::pipeline
