// Chat-completions message objects, written straight to text (the request body is never a tree).
#include <baton/json_text.hpp>
#include <baton/model.hpp>

#include <boost/json.hpp>

namespace baton {

chat_message assistant_message(std::string text, const chat_completion& c) {
    chat_message m{"assistant", std::move(text), c.tool_calls, {}};
    m.reasoning = c.reasoning;
    return m;
}

void append_chat_message(std::string& out, const chat_message& m) {
    using namespace std::string_view_literals;
    out += "{\"role\":"sv;
    // The usual roles as they are written; literals appended with their lengths known.
    if (m.role == "user")
        out += "\"user\""sv;
    else if (m.role == "assistant")
        out += "\"assistant\""sv;
    else if (m.role == "system")
        out += "\"system\""sv;
    else if (m.role == "tool")
        out += "\"tool\""sv;
    else
        append_json_string(out, m.role);
    out += ",\"content\":"sv;
    if (m.content.empty() && !m.tool_calls.empty())
        out += "null"sv;
    else
        append_json_string(out, m.content);
    if (!m.tool_calls.empty()) {
        out += ",\"tool_calls\":["sv;
        for (std::size_t i = 0; i < m.tool_calls.size(); ++i) {
            const auto& c = m.tool_calls[i];
            out += i ? ",{\"id\":"sv : "{\"id\":"sv;
            append_json_string(out, c.id);
            out += ",\"type\":\"function\",\"function\":{\"name\":"sv;
            append_json_string(out, c.name);
            out += ",\"arguments\":"sv;
            append_json_string(out, c.arguments);
            out += "}}"sv;
        }
        out += ']';
    }
    if (m.role == "tool") {
        out += ",\"tool_call_id\":"sv;
        append_json_string(out, m.tool_call_id);
    }
    // Sent back only under the names the provider used: a strict server refuses unknown fields.
    if (!m.reasoning.field.empty() && !m.reasoning.text.empty()) {
        out += ',';
        append_json_string(out, m.reasoning.field);
        out += ':';
        append_json_string(out, m.reasoning.text);
    }
    if (!m.reasoning.details.empty()) {
        out += ",\"reasoning_details\":"sv;
        append_json(out, m.reasoning.details);
    }
    out += '}';
}

} // namespace baton
