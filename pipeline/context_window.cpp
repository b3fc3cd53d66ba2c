#include "pipeline/context_window.hpp"

#include <algorithm>

namespace baton::pipeline {

namespace {
constexpr std::int64_t per_message = 4;

std::string_view string_at(const json::object& o, std::string_view key) {
    auto* v = o.if_contains(key);
    return v && v->is_string() ? std::string_view(v->get_string()) : std::string_view{};
}

std::int64_t int_at(const json::object& o, std::string_view key) {
    auto* v = o.if_contains(key);
    return v && v->is_int64() ? v->get_int64() : 0;
}

std::size_t message_bytes(const chat_message& m) {
    std::size_t n = sizeof(chat_message) + sizeof(window_item) + m.content.capacity() +
                    m.tool_call_id.capacity();
    for (const auto& c : m.tool_calls)
        n += sizeof(c) + c.id.capacity() + c.name.capacity() + c.arguments.capacity();
    return n;
}

} // namespace

std::string_view clip_utf8(std::string_view s, std::size_t max) {
    if (s.size() <= max) return s;
    std::size_t end = max;
    while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80)
        --end;
    return s.substr(0, end);
}

std::int64_t estimate_tokens(std::string_view text) {
    std::int64_t ascii = 0, other = 0;
    for (unsigned char c : text) {
        if (c < 0x80) ++ascii;
        else if ((c & 0xC0) != 0x80) ++other; // a lead byte: one character
    }
    return (ascii + 3) / 4 + other;
}

std::int64_t estimate_tokens(const chat_message& m) {
    std::int64_t n = per_message + estimate_tokens(m.content);
    for (const auto& c : m.tool_calls)
        n += per_message + estimate_tokens(c.name) + estimate_tokens(c.arguments) + 3;
    if (!m.tool_call_id.empty()) n += 3;
    // Reasoning counts where it is sent back (append_chat_message): a thinking model's can be
    // longer than its answer.
    if (!m.reasoning.field.empty()) n += estimate_tokens(m.reasoning.text);
    if (!m.reasoning.details.empty()) n += estimate_tokens(json::serialize(m.reasoning.details));
    return n;
}

std::int64_t estimate_tokens(const std::vector<tool_schema>& tools) {
    std::int64_t n = 0;
    for (const auto& t : tools)
        n += 8 + estimate_tokens(t.name) + estimate_tokens(t.description) +
             estimate_tokens(json::serialize(t.parameters));
    return n;
}

std::string tool_output_preview(std::string_view output, std::string_view where) {
    std::string s(clip_utf8(output, preview_bytes));
    s += "\n[trimmed: " + std::to_string(output.size()) + " bytes in all; the full output is in " +
         std::string(where) + "]";
    return s;
}

std::size_t context_window::item_bytes(std::size_t i) const {
    return message_bytes(messages[i]);
}

void context_window::forget_json_from(std::size_t i) {
    if (i >= starts_.size()) return;
    encoded_.resize(i == 0 ? 0 : starts_[i] - 1); // and the comma before it
    starts_.resize(i);
}

std::string_view context_window::encode(const std::vector<chat_message>& lent) {
    if (lent.size() < items.size()) return {};
    for (std::size_t i = starts_.size(); i < items.size(); ++i) {
        if (i) encoded_ += ',';
        starts_.push_back(encoded_.size());
        append_chat_message(encoded_, lent[i]);
    }
    return encoded_;
}

void context_window::count(std::size_t i, int sign) {
    const auto& it = items[i];
    auto step = [sign](std::size_t& n) { n = sign > 0 ? n + 1 : n - std::min<std::size_t>(n, 1); };
    if (it.kind == item_kind::tool_calls || it.kind == item_kind::tool_result) step(tool_items_);
    if (it.kind == item_kind::tool_result && !it.trimmed && messages[i].content.size() > trim_above_bytes)
        step(trimmable_);
}

void context_window::push(chat_message m, window_item it) {
    it.tokens = estimate_tokens(m);
    tokens += it.tokens;
    bytes_ += message_bytes(m);
    messages.push_back(std::move(m));
    items.push_back(std::move(it));
    count(items.size() - 1, +1);
}

void context_window::recount(std::size_t i) {
    // The message changed: its JSON (and that of the items after it) is written again when
    // next needed.
    forget_json_from(i);
    tokens -= items[i].tokens;
    items[i].tokens = estimate_tokens(messages[i]);
    tokens += items[i].tokens;
}

void context_window::erase_if_not_pinned(std::size_t from, std::size_t to) {
    from = std::max(from, pinned);
    if (from >= to) return;
    forget_json_from(from);
    for (std::size_t i = from; i < to; ++i) {
        tokens -= items[i].tokens;
        bytes_ -= std::min(bytes_, item_bytes(i));
        count(i, -1);
    }
    messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(from),
                   messages.begin() + static_cast<std::ptrdiff_t>(to));
    items.erase(items.begin() + static_cast<std::ptrdiff_t>(from),
                items.begin() + static_cast<std::ptrdiff_t>(to));
}

void context_window::set_pinned(const std::string& agent_name, const std::vector<std::string>& blocks) {
    bool same = agent == agent_name && pinned == blocks.size();
    for (std::size_t i = 0; same && i < pinned; ++i)
        same = messages[i].content == blocks[i];
    if (same) return;
    forget_json_from(0);
    std::vector<chat_message> rest_m(std::make_move_iterator(messages.begin() + static_cast<std::ptrdiff_t>(pinned)),
                                     std::make_move_iterator(messages.end()));
    auto first_rest = items.begin() + static_cast<std::ptrdiff_t>(pinned);
    std::vector<window_item> rest_i(std::make_move_iterator(first_rest),
                                    std::make_move_iterator(items.end()));
    messages.clear();
    items.clear();
    tokens = 0;
    bytes_ = 0;
    tool_items_ = trimmable_ = 0;
    for (const auto& b : blocks)
        push({"system", b, {}, {}}, {0, 0, item_kind::pinned, false});
    pinned = blocks.size();
    agent = agent_name;
    tool_tokens = -1;
    for (std::size_t i = 0; i < rest_m.size(); ++i)
        push(std::move(rest_m[i]), std::move(rest_i[i]));
}

std::string_view context_window::summary() const {
    if (pinned < items.size() && items[pinned].kind == item_kind::summary) return messages[pinned].content;
    return {};
}

void context_window::add(const tape_entry& e) {
    if (e.id != 0 && e.id <= last_id) return;
    apply(e);
    if (e.id > last_id) last_id = e.id;
}

void context_window::close_open_calls() {
    for (auto& id : open_calls_)
        push({"tool", "no result: the turn ended before the call returned", {}, std::move(id)},
             {open_calls_id_, 0, item_kind::tool_result, false});
    open_calls_.clear();
}

void context_window::apply(const tape_entry& e) {
    const bool joins_round =
        e.kind == tape_kind::tool_result || (e.kind == tape_kind::tool_call && attach_calls_ &&
                                             !messages.empty() && messages.back().role == "assistant");
    if (!joins_round && !open_calls_.empty()) close_open_calls();
    switch (e.kind) {
    case tape_kind::anchor:
        take_anchor(e.payload, e.id);
        attach_calls_ = false;
        return;
    case tape_kind::message: {
        auto role = string_at(e.payload, "role");
        auto* text = e.payload.if_contains("text");
        if (role.empty() || !text || !text->is_string()) return;
        push({std::string(role), std::string(text->get_string()), {}, {}},
             {e.id, 0, item_kind::message, false});
        attach_calls_ = role == "assistant";
        return;
    }
    case tape_kind::tool_call: {
        tool_call call{std::string(string_at(e.payload, "call_id")), std::string(string_at(e.payload, "name")),
                       std::string(string_at(e.payload, "arguments"))};
        if (auto* a = e.payload.if_contains("arguments"); a && !a->is_string())
            call.arguments = json::serialize(*a);
        if (attach_calls_ && !messages.empty() && messages.back().role == "assistant") {
            messages.back().tool_calls.push_back(std::move(call));
            if (items.back().kind != item_kind::tool_calls) {
                count(items.size() - 1, -1);
                items.back().kind = item_kind::tool_calls;
                count(items.size() - 1, +1);
            }
            recount(items.size() - 1);
        } else {
            chat_message m{"assistant", {}, {}, {}};
            m.tool_calls.push_back(std::move(call));
            push(std::move(m), {e.id, 0, item_kind::tool_calls, false});
        }
        open_calls_.push_back(messages.back().tool_calls.back().id);
        open_calls_id_ = items.back().id;
        attach_calls_ = true;
        return;
    }
    case tape_kind::tool_result: {
        std::string output;
        if (auto* o = e.payload.if_contains("output"))
            output = o->is_string() ? std::string(o->get_string()) : json::serialize(*o);
        std::string call_id(string_at(e.payload, "call_id"));
        std::erase(open_calls_, call_id);
        push({"tool", std::move(output), {}, std::move(call_id)},
             {e.id, 0, item_kind::tool_result, false});
        attach_calls_ = false;
        return;
    }
    case tape_kind::event: {
        attach_calls_ = false;
        if (string_at(e.payload, "name") != "compaction") return;
        auto* d = e.payload.if_contains("data");
        if (!d || !d->is_object()) return;
        auto stage = string_at(d->get_object(), "stage");
        auto through = int_at(d->get_object(), "through");
        if (stage == "trim_tool_outputs") trim_outputs(through);
        else if (stage == "drop_tool_rounds") drop_rounds(through);
        return;
    }
    case tape_kind::error:
        attach_calls_ = false;
        return;
    }
}

void context_window::take_anchor(const json::object& payload, std::int64_t id) {
    std::int64_t from = int_at(payload, "from");
    // The old summary goes; so does everything older than what the anchor kept.
    if (pinned < items.size() && items[pinned].kind == item_kind::summary)
        erase_if_not_pinned(pinned, pinned + 1);
    std::size_t keep = pinned;
    if (from > 0) {
        while (keep < items.size() && items[keep].id < from)
            ++keep;
    } else {
        keep = items.size();
    }
    erase_if_not_pinned(pinned, keep);
    auto text = string_at(payload, "summary");
    if (text.empty()) return;
    chat_message m{"system", std::string(text), {}, {}};
    window_item it{id, estimate_tokens(m), item_kind::summary, false};
    tokens += it.tokens;
    bytes_ += message_bytes(m);
    forget_json_from(pinned);
    messages.insert(messages.begin() + static_cast<std::ptrdiff_t>(pinned), std::move(m));
    items.insert(items.begin() + static_cast<std::ptrdiff_t>(pinned), it);
}

void context_window::trim_outputs(std::int64_t through) {
    for (std::size_t i = pinned; i < items.size(); ++i) {
        auto& it = items[i];
        if (it.kind != item_kind::tool_result || it.trimmed || it.id > through) continue;
        if (messages[i].content.size() <= trim_above_bytes) continue;
        count(i, -1);
        bytes_ -= std::min(bytes_, messages[i].content.capacity());
        messages[i].content = tool_output_preview(messages[i].content, "tape entry " + std::to_string(it.id));
        bytes_ += messages[i].content.capacity();
        it.trimmed = true;
        count(i, +1);
        recount(i);
    }
}

void context_window::drop_rounds(std::int64_t through) {
    std::size_t out = pinned;
    for (std::size_t i = pinned; i < items.size(); ++i) {
        auto& it = items[i];
        bool old = it.id <= through;
        if (old && (it.kind == item_kind::tool_result || it.kind == item_kind::tool_calls)) count(i, -1);
        if (old && it.kind == item_kind::tool_result) {
            forget_json_from(i);
            tokens -= it.tokens;
            bytes_ -= std::min(bytes_, item_bytes(i));
            continue;
        }
        if (old && it.kind == item_kind::tool_calls) {
            // An assistant text that asked for tools keeps its text.
            if (messages[i].content.empty()) {
                forget_json_from(i);
                tokens -= it.tokens;
                bytes_ -= std::min(bytes_, item_bytes(i));
                continue;
            }
            messages[i].tool_calls.clear();
            it.kind = item_kind::message;
            count(i, +1);
            recount(i);
        }
        if (out != i) {
            messages[out] = std::move(messages[i]);
            items[out] = std::move(it);
        }
        ++out;
    }
    messages.resize(out);
    items.resize(out);
}

void context_window::learn(std::int64_t reported, std::int64_t estimated) {
    if (reported <= 0 || estimated <= 0) return;
    double ratio = static_cast<double>(reported) / static_cast<double>(estimated);
    token_factor = std::clamp(0.5 * token_factor + 0.5 * ratio, 0.5, 4.0);
}

context_span find_context_span(const std::vector<tape_entry>& tail, bool tail_is_whole_tape) {
    context_span span;
    for (std::size_t i = tail.size(); i-- > 0;) {
        if (tail[i].kind != tape_kind::anchor) continue;
        span.from = int_at(tail[i].payload, "from");
        span.first = i;
        if (span.from <= 0) {
            span.complete = true;
            return span;
        }
        while (span.first > 0 && tail[span.first - 1].id >= span.from)
            --span.first;
        span.complete = span.first > 0 || tail_is_whole_tape || tail.front().id == span.from;
        return span;
    }
    span.first = 0;
    span.complete = tail_is_whole_tape;
    return span;
}

} // namespace baton::pipeline
