#include "src/app/chat_view.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <cstdlib>
#include <unistd.h>
#include <utility>

namespace baton {

namespace json = boost::json;

namespace {
std::string string_or_json(const json::object& o, std::string_view key) {
    const auto* v = o.if_contains(key);
    if (!v || v->is_null()) return {};
    if (v->is_string()) return std::string(v->get_string());
    return json::serialize(*v);
}

// Tool arguments arrive as the model wrote them; re-serialized they fit on one line.
std::string compact_arguments(const json::object& o) {
    std::string raw = string_or_json(o, "arguments");
    boost::system::error_code ec;
    auto parsed = json::parse(raw, ec);
    return ec ? raw : json::serialize(parsed);
}

// Finished turns remembered for reply frames that come after turn.finished.
constexpr std::size_t shown_kept = 256;

bool blank(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
} // namespace

std::string one_line_preview(std::string_view s, std::size_t max) {
    std::string out;
    bool space = false;
    for (char c : s) {
        if (blank(c)) {
            space = !out.empty();
            continue;
        }
        if (space) out.push_back(' ');
        space = false;
        out.push_back(c);
    }
    if (out.size() <= max) return out;
    std::size_t cut = max;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80)
        --cut;
    out.resize(cut);
    return out + "...";
}

bool dim_stdout() {
    return ::isatty(1) == 1 && !std::getenv("NO_COLOR");
}

void chat_view::end_line() {
    if (open_line_) out_ << '\n' << std::flush;
    open_line_ = false;
    streaming_turn_.clear();
}

void chat_view::line(std::string_view text) {
    end_line();
    out_ << text << '\n' << std::flush;
}

void chat_view::note(std::string_view text) {
    line(text);
}

void chat_view::prompt() {
    end_line();
    out_ << "you> " << std::flush;
}

void chat_view::on_error(std::string_view code, std::string_view message) {
    line("[error: " + std::string(code) + ": " + std::string(message) + "]");
}

// One folded line for the reasoning of a model call, when it has any; never on the reply's line.
void chat_view::show_thinking(std::string_view turn_id) {
    auto it = turns_.find(turn_id);
    if (it == turns_.end() || it->second.reasoning.empty()) return;
    it->second.reasoning_chars = 0;
    std::string preview = one_line_preview(std::exchange(it->second.reasoning, {}), thinking_preview);
    if (preview.empty()) return;
    std::string text = "  [thinking: " + preview + "]";
    line(dim_ ? "\x1b[2m" + text + "\x1b[0m" : text);
}

void chat_view::on_event(std::string_view turn_id, std::string_view type, const json::object& data) {
    if (type == "model.reasoning") {
        std::string text = string_or_json(data, "text");
        auto& t = turns_[std::string(turn_id)];
        // Only its start is shown: once that is more than a preview, the rest is not kept.
        if (t.reasoning_chars > thinking_preview) return;
        for (char c : text)
            t.reasoning_chars += !blank(c);
        t.reasoning += text;
        return;
    }
    if (type == "model.delta") {
        std::string text = string_or_json(data, "text");
        if (text.empty()) return;
        if (streaming_turn_ != turn_id) {
            // Reasoning goes above the reply; what comes once the reply is under way waits for
            // the end of its line.
            show_thinking(turn_id);
            end_line();
            out_ << "baton> ";
            streaming_turn_ = turn_id;
        }
        out_ << text << std::flush;
        open_line_ = text.back() != '\n';
        turns_[std::string(turn_id)].streamed += text;
        return;
    }
    if (type == "model.call") {
        end_line();
        show_thinking(turn_id);
        turns_[std::string(turn_id)].streamed.clear();
        const auto* step = data.if_contains("step");
        // Step 1 is every turn's; later ones follow tool results and are worth a line.
        if (step && step->is_int64() && step->get_int64() > 1)
            line("  [step " + std::to_string(step->get_int64()) + "]");
        return;
    }
    if (type == "model.result") {
        end_line();
        show_thinking(turn_id);
        return;
    }
    if (type == "tool.call") {
        show_thinking(turn_id);
        std::string name = string_or_json(data, "name");
        turns_[std::string(turn_id)].tools[string_or_json(data, "call_id")] = name;
        line("  [tool " + name + " " + one_line_preview(compact_arguments(data), args_preview) + "]");
        return;
    }
    if (type == "tool.result") {
        auto& tools = turns_[std::string(turn_id)].tools;
        auto it = tools.find(string_or_json(data, "call_id"));
        std::string name = it == tools.end() ? std::string("?") : it->second;
        const auto* ok = data.if_contains("ok");
        bool good = ok && ok->is_bool() && ok->get_bool();
        line("  [tool " + name + " -> " + (good ? "ok: " : "error: ") +
             one_line_preview(string_or_json(data, "output"), output_preview) + "]");
        return;
    }
    if (type == "turn.finished") finish(turn_id, data);
}

void chat_view::finish(std::string_view turn_id, const json::object& data) {
    end_line();
    show_thinking(turn_id);
    std::string shown;
    if (auto it = turns_.find(turn_id); it != turns_.end()) {
        shown = std::move(it->second.streamed);
        turns_.erase(it);
    }
    for (const auto& [id, text] : shown_)
        if (id == turn_id) shown = text;
    std::string status = string_or_json(data, "status");
    std::string reply = string_or_json(data, "reply");
    // Remotely a completed turn's reply comes as a reply frame; a partial one may never come.
    bool print_reply = mode_ == mode::in_process || status != "completed";
    if (print_reply && !reply.empty() && reply != shown) {
        line("baton> " + reply);
        shown = reply;
    }
    if (status != "completed") {
        std::string what = status.empty() ? std::string("finished") : status;
        const auto* err = data.if_contains("error");
        if (err && err->is_object())
            what += ": " + string_or_json(err->get_object(), "code") + ": " +
                    string_or_json(err->get_object(), "message");
        line("[" + what + "]");
    }
    remember_shown(turn_id, std::move(shown));
}

void chat_view::remember_shown(std::string_view turn_id, std::string text) {
    for (auto& [id, t] : shown_)
        if (id == turn_id) {
            t = std::move(text);
            return;
        }
    shown_.emplace_back(std::string(turn_id), std::move(text));
    while (shown_.size() > shown_kept)
        shown_.pop_front();
}

void chat_view::on_reply(std::string_view turn_id, std::string_view text) {
    std::string_view shown;
    if (auto it = turns_.find(turn_id); it != turns_.end()) shown = it->second.streamed;
    for (const auto& [id, t] : shown_)
        if (id == turn_id) shown = t;
    if (!text.empty() && text == shown) return;
    show_thinking(turn_id);
    line("baton> " + std::string(text));
    if (auto it = turns_.find(turn_id); it != turns_.end())
        it->second.streamed = std::string(text);
    else
        remember_shown(turn_id, std::string(text));
}

} // namespace baton
