// A session's context window as the model sees it, with the bookkeeping that keeps it within a
// token budget: per message a token estimate and the tape entry it came from, and running totals,
// so that assembling a prompt never rescans the tape. Plain code, no I/O.
//
// The window is a pure function of the tape: the pinned blocks, then from the last anchor on (and
// from the entry its `from` names, when it kept recent messages), every message and tool
// round-trip, with the compaction events (`trim_tool_outputs`, `drop_tool_rounds`) applied. add()
// applies one entry at a time, so a window extended turn by turn and one rebuilt from the store
// agree.
#pragma once

#include <baton/model.hpp>
#include <baton/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace baton::pipeline {

// The longest prefix of at most `max` bytes that ends on a UTF-8 character boundary.
std::string_view clip_utf8(std::string_view s, std::size_t max);

// Tokens without a tokenizer: a quarter of the ASCII bytes, one per other character.
std::int64_t estimate_tokens(std::string_view text);
// A message's estimate, including its framing, tool calls and the reasoning it sends back.
std::int64_t estimate_tokens(const chat_message& m);
std::int64_t estimate_tokens(const std::vector<tool_schema>& tools);

// Tool outputs longer than this become previews in stage 1.
inline constexpr std::size_t trim_above_bytes = 512;
inline constexpr std::size_t preview_bytes = 200;
// The preview of a tool output: its first bytes and where the full text is (`where`, e.g.
// "tape entry 42").
std::string tool_output_preview(std::string_view output, std::string_view where);

enum class item_kind : std::uint8_t { pinned, summary, message, tool_calls, tool_result };

struct window_item {
    std::int64_t id = 0; // the tape entry it came from (the anchor, for a summary; 0 for pinned)
    std::int64_t tokens = 0;
    item_kind kind = item_kind::message;
    bool trimmed = false;
};

class context_window {
public:
    // `messages[i]` is described by `items[i]`. While a turn borrows the window, `messages` is
    // lent out (moved to turn_context::history) and `items` stays here.
    std::vector<chat_message> messages;
    std::vector<window_item> items;
    std::int64_t tokens = 0;   // sum of the items' estimates
    std::size_t pinned = 0;    // leading pinned blocks
    std::string agent;         // whose pinned blocks lead
    double token_factor = 1.0; // the model's count / our estimate, learned per session
    std::int64_t last_id = 0;  // the newest tape entry applied
    std::int64_t tool_tokens = -1; // the agent's tool schemas, estimated (-1: not yet)

    // Replaces the leading pinned blocks (first use, or the session's agent changed).
    void set_pinned(const std::string& agent_name, const std::vector<std::string>& blocks);
    // Applies one stored tape entry (see above). Entries already applied (id <= last_id) are
    // ignored, so applying a batch twice is harmless.
    void add(const tape_entry& e);
    // The same rules for entries not stored yet (a turn's own compaction, applied at once).
    void apply(const tape_entry& e);
    // Answers the tool calls of the last round that have no result on the tape (a turn cut
    // during its tools by an older version, or by a hook's tape): an OpenAI-compatible server
    // refuses a request holding a call without its result. Each gets a result saying so. Called
    // by apply() before any entry that ends the round, and before a prompt is built.
    void close_open_calls();
    // The summary's text, or empty.
    std::string_view summary() const;
    // What the messages, their items and their kept JSON take (for the cache's bound).
    std::size_t bytes() const {
        return bytes_ + encoded_.capacity() + starts_.capacity() * sizeof(std::size_t);
    }

    // Stage helpers for the planner: how much stage 1 or 2 would change, without changing.
    bool has_trimmable_outputs() const { return trimmable_ > 0; }
    bool has_tool_rounds() const { return tool_items_ > 0; }

    // Learns from a model call: `reported` prompt tokens for a request we estimated at `estimated`.
    void learn(std::int64_t reported, std::int64_t estimated);

    // The whole window as chat-completions message objects joined by commas
    // (model_request::encoded): the JSON kept from earlier calls, extended with that of the items
    // added since, written from `lent` (the window's messages, lent to a request). Empty when
    // `lent` is shorter than the window (it was not handed over whole). Valid until the window
    // next changes.
    std::string_view encode(const std::vector<chat_message>& lent);

private:
    void push(chat_message m, window_item it);
    void erase_if_not_pinned(std::size_t from, std::size_t to);
    void trim_outputs(std::int64_t through);
    void drop_rounds(std::int64_t through);
    void take_anchor(const json::object& payload, std::int64_t id);
    void recount(std::size_t i);
    // Keeps the stage counters below in step with an item entering (+1) or leaving (-1).
    void count(std::size_t i, int sign);
    // What an item's message takes (for the cache's bound).
    std::size_t item_bytes(std::size_t i) const;
    // Items from `i` on changed, moved or went: their kept JSON goes too.
    void forget_json_from(std::size_t i);
    std::size_t bytes_ = 0;
    // The JSON of items [0, starts_.size()), joined by commas, item i's from starts_[i]: one
    // block, so a request copies the whole context at once. Appended to as the window grows,
    // cut back to the first item that changed.
    std::string encoded_;
    std::vector<std::size_t> starts_;
    std::size_t tool_items_ = 0; // tool_calls and tool_result items
    std::size_t trimmable_ = 0;  // tool results over trim_above_bytes, not trimmed yet
    bool attach_calls_ = false; // the previous entry was an assistant message or a tool call
    std::vector<std::string> open_calls_; // the last round's call ids without a result yet
    std::int64_t open_calls_id_ = 0;      // the tape id of their item
};

// The entries a window needs, oldest first, out of a tape tail that reaches back far enough:
// from the last anchor (or the entry its `from` names) on. `complete` is false when the tail does
// not reach that far (read more and ask again). `from` (out) names the first id needed.
struct context_span {
    std::size_t first = 0; // index into the tail
    std::int64_t from = 0; // when the anchor kept older entries: the first id it kept
    bool complete = false;
};
context_span find_context_span(const std::vector<tape_entry>& tail, bool tail_is_whole_tape);

} // namespace baton::pipeline
