#include "pipeline/stages.hpp"

#include <boost/system/system_error.hpp>

namespace baton::pipeline {

asio::awaitable<std::optional<model_output>> run_model(turn_context& ctx, const prompt& p) {
    const auto& cfg = ctx.agent->config;
    model_request req;
    req.model = cfg.model.model;
    req.messages = p.messages;
    req.max_tokens = cfg.model.max_output_tokens;
    chat_completion resp;
    try {
        resp = co_await ctx.agent->model->complete(req, {});
    } catch (const turn_error&) {
        throw;
    } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted) throw;
        throw turn_error("model_error", e.what());
    } catch (const std::exception& e) {
        throw turn_error("model_error", e.what());
    }
    model_output out;
    out.reply = std::move(resp.text);
    out.steps = 1;
    out.usage = {resp.prompt_tokens, resp.completion_tokens};
    ctx.new_entries.push_back(make_message("assistant", out.reply));
    co_return out;
}

} // namespace baton::pipeline
