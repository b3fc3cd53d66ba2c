#include "pipeline/stages.hpp"

namespace baton::pipeline {

asio::awaitable<std::optional<std::string>> resolve_session(turn_context& ctx) {
    const auto& in = ctx.inbound;
    if (!in.session_id.empty()) co_return in.session_id;
    if (in.chat_id.empty())
        throw turn_error("invalid_request", "inbound has neither session id nor chat id");
    std::string sid = in.channel + ":" + in.chat_id;
    if (!valid_session_id(sid))
        throw turn_error("invalid_request", "derived session id is invalid: " + sid);
    co_return sid;
}

} // namespace baton::pipeline
