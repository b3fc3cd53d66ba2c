// Turns OpenAI chat-completions output into one chat_completion, without I/O: either the
// chat.completion.chunk objects of a stream, folded in one by one as the SSE parser yields them,
// or the body of a non-streaming response. Both paths produce the same type.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/fwd.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace baton {

// What a model thought before it answered. Never part of the reply. Some providers need it sent
// back with the assistant message in the next request of the turn (DeepSeek's thinking mode
// answers 400 without it on tool-call steps), so it keeps the name it came under.
struct model_reasoning {
    // The readable text: `reasoning_content` (DeepSeek, xAI, Qwen, Moonshot, GLM), `reasoning`
    // (Groq, OpenRouter, Ollama), Mistral's "thinking" content parts, or the text of OpenRouter's
    // reasoning_details when nothing else carried it.
    std::string text;
    // The message field it came in and goes back in: "reasoning_content" or "reasoning"; empty
    // when it came as content parts or inside reasoning_details only (then `text` is not sent).
    std::string field;
    // OpenRouter's reasoning_details, the stream's pieces merged by index; sent back as they came
    // (encrypted blocks and signatures included). Empty when none came.
    boost::json::array details;

    bool empty() const { return text.empty() && details.empty(); }
    bool operator==(const model_reasoning&) const = default;
};

struct chat_completion {
    struct tool_call {
        std::string id;
        std::string name;
        std::string arguments; // raw JSON text, as the model wrote it (it may not even parse)

        bool operator==(const tool_call&) const = default;
    };

    std::string id;    // "chatcmpl-..."
    std::string model; // the model that actually answered, e.g. "gpt-4o-2024-08-06"
    std::string text;  // the reply; a refusal's text when `refusal`
    model_reasoning reasoning;
    bool refusal = false;              // the model refused (OpenAI's `refusal`): `text` says why
    std::vector<tool_call> tool_calls; // ordered by the stream's tool-call index
    std::string finish_reason;         // "stop", "length", "tool_calls", ...; empty if never sent
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
    bool has_usage = false;

    bool operator==(const chat_completion&) const = default;
};

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
