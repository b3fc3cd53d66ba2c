// Turns OpenAI chat-completions output into one chat_completion, without I/O: either the
// chat.completion.chunk objects of a stream, folded in one by one as the SSE parser yields them,
// or the body of a non-streaming response. Both paths produce the same type.
#pragma once

#include <baton/model.hpp>

#include <boost/json/array.hpp>
#include <boost/json/fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace baton {

// What one chunk appended: reply text (model.delta events) and reasoning (model.reasoning).
struct chunk_delta {
    std::string text;
    std::string reasoning;
};

// Assembles a streamed completion. Only the choice with index 0 is kept (requests use n = 1).
// Content comes as a string or as an array of parts (Mistral: "text" parts are the reply,
// "thinking" parts reasoning); a refusal's text is the reply. Tool-call fragments are matched by
// their `index`; fragments without one (Mistral) start a new call when they bring an id not seen
// yet and continue the last call otherwise. Usage is read from `usage`, else from `x_groq.usage`.
// add() returns what the chunk appended. A chunk with wrong JSON types, a tool-call id/name
// contradicting an earlier fragment, or an in-stream {"error": ...} object sets `error` (naming
// the JSON path), returns nothing and changes nothing; a good chunk clears `error`.
class chat_stream_assembler {
public:
    chunk_delta add(const boost::json::object& chunk, std::string& error);

    // A chunk as the text of its JSON object: what add() does with it parsed, the same result,
    // the same error. A text that is not a JSON object sets `error` to "a stream event is not a
    // JSON object". The common chunk (reply text, a finish_reason, ids, usage; nothing that add() would
    // reject) is read straight from the text, without building the JSON tree; see add_common().
    chunk_delta add_text(std::string_view chunk, std::string& error);

    // The fast half of add_text(): true when `chunk` is a JSON object whose only fields add()
    // reads are `id`, `model` (strings), a `usage` of null or an object whose `prompt_tokens` and
    // `completion_tokens` are null or plain integers of up to 18 digits, a `choices` array of at most one
    // object with `index` 0, a `finish_reason` string and a `delta` whose `content` is a string
    // without \u escapes; the text must be ASCII. Then it does what add() would do and fills
    // `out`. Otherwise false, with nothing changed: the caller parses the text and calls add().
    bool add_common(std::string_view chunk, chunk_delta& out, std::string& error);

    const chat_completion& result() const { return result_; }
    chat_completion take() {
        indices_.clear();
        last_call_ = 0;
        return std::exchange(result_, {});
    }

private:
    chat_completion result_;
    std::vector<std::int64_t> indices_; // the stream index of each entry of result_.tool_calls
    std::size_t last_call_ = 0;         // the entry the latest fragment went to
};

// Folds one piece of OpenRouter's streamed reasoning_details into `into`: an item whose `index`
// is already there extends it (its "text", "summary" and "data" strings appended, other fields
// filled where still missing or empty); any other item is appended. Items of another `type` at
// the same index are separate.
void merge_reasoning_details(boost::json::array& into, const boost::json::array& piece);

// Reads a non-streaming response body, by the same rules as the stream. On malformed input sets
// `error` (with the JSON path) and returns an empty chat_completion; a null message.content is an
// empty text, not an error.
chat_completion parse_chat_completion(const boost::json::object& body, std::string& error);

} // namespace baton
