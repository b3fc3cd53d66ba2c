// Turns OpenAI chat-completions output into one chat_completion, without I/O: either the
// chat.completion.chunk objects of a stream, folded in one by one as the SSE parser yields them,
// or the body of a non-streaming response. Both paths produce the same type.
#pragma once

#include <boost/json/fwd.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace baton {

struct chat_completion {
    struct tool_call {
        std::string id;
        std::string name;
        std::string arguments; // raw JSON text, as the model wrote it (it may not even parse)

        bool operator==(const tool_call&) const = default;
    };

    std::string id;    // "chatcmpl-..."
    std::string model; // the model that actually answered, e.g. "gpt-4o-2024-08-06"
    std::string text;
    std::vector<tool_call> tool_calls; // ordered by the stream's tool-call index
    std::string finish_reason;         // "stop", "length", "tool_calls", ...; empty if never sent
    std::int64_t prompt_tokens = 0;
    std::int64_t completion_tokens = 0;
    bool has_usage = false;

    bool operator==(const chat_completion&) const = default;
};

// Assembles a streamed completion. Only the choice with index 0 is kept (requests use n = 1).
// add() returns the text the chunk appended, to publish as a model.delta event. A chunk with
// wrong JSON types, a tool-call id/name contradicting an earlier fragment, or an in-stream
// {"error": ...} object sets `error` (naming the JSON path), returns "" and changes nothing;
// a good chunk clears `error`.
class chat_stream_assembler {
public:
    std::string add(const boost::json::object& chunk, std::string& error);

    const chat_completion& result() const { return result_; }
    chat_completion take() {
        indices_.clear();
        return std::exchange(result_, {});
    }

private:
    chat_completion result_;
    std::vector<std::int64_t> indices_; // the stream index of each entry of result_.tool_calls
};

// Reads a non-streaming response body. On malformed input sets `error` (with the JSON path) and
// returns an empty chat_completion; a null message.content is an empty text, not an error.
chat_completion parse_chat_completion(const boost::json::object& body, std::string& error);

} // namespace baton
