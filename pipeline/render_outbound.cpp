#include "pipeline/stages.hpp"

namespace baton::pipeline {

asio::awaitable<std::vector<outbound>> render_outbound(turn_context& ctx) {
    std::vector<outbound> items;
    if (ctx.output.reply.empty()) co_return items;
    outbound o;
    o.channel = ctx.inbound.channel;
    if (const auto* d = ctx.inbound.deliver.if_object()) {
        if (auto* ch = d->if_contains("channel"); ch && ch->is_string()) o.channel = ch->get_string();
        if (auto* to = d->if_contains("to"); to && to->is_string()) o.to = to->get_string();
    }
    o.text = ctx.output.reply;
    items.push_back(std::move(o));
    co_return items;
}

} // namespace baton::pipeline
