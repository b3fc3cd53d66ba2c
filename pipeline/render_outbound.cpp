#include "pipeline/stages.hpp"

namespace baton::pipeline {

namespace {
// Where a message's sender waits for its reply: its channel, or its `deliver`.
outbound route_of(std::string_view channel, const json::value& deliver) {
    outbound o;
    o.channel = channel;
    if (const auto* d = deliver.if_object()) {
        if (auto* ch = d->if_contains("channel"); ch && ch->is_string()) o.channel = ch->get_string();
        if (auto* to = d->if_contains("to"); to && to->is_string()) o.to = to->get_string();
    }
    return o;
}
} // namespace

// The reply goes where the turn's message came from (or its `deliver`), and to every other route
// of the messages it answered too (`collect`, `steer`): found by a new-user check, a folded
// message's webhook or WebSocket sender got nothing. One item a route: senders on one route (a
// session's WebSocket followers, one webhook) get the reply once.
asio::awaitable<std::vector<outbound>> render_outbound(turn_context& ctx) {
    std::vector<outbound> items;
    if (ctx.output.reply.empty()) co_return items;
    auto add = [&](outbound o) {
        for (const auto& i : items)
            if (i.channel == o.channel && i.to == o.to) return;
        o.text = ctx.output.reply;
        items.push_back(std::move(o));
    };
    add(route_of(ctx.inbound.channel, ctx.inbound.deliver));
    for (const auto& m : ctx.inbound.collected)
        add(route_of(m.channel, m.deliver));
    for (const auto& m : ctx.steered)
        add(route_of(m.channel, m.deliver));
    co_return items;
}

} // namespace baton::pipeline
