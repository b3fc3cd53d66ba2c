// The model-client interface the agent loop calls. `echo` is the offline model; issue 3 adds the
// OpenAI-compatible client behind the same interface.
#pragma once

#include <baton/types.hpp>

#include <boost/asio/awaitable.hpp>

#include <memory>
#include <string>
#include <vector>

namespace baton {

struct chat_message {
    std::string role; // system | user | assistant | tool
    std::string content;
};

struct model_request {
    std::string model;
    std::vector<chat_message> messages;
    std::int64_t max_tokens = 0;
};

struct model_response {
    std::string text;
    std::string finish_reason = "stop";
    baton::usage usage;
};

class model_client {
public:
    virtual ~model_client() = default;
    // Cancellation: follows the awaiting coroutine's cancellation slot.
    virtual boost::asio::awaitable<model_response> complete(const model_request& req) = 0;
    virtual std::string name() const = 0;
};

// Replies "echo: <last user text>"; usage counts whitespace-separated words.
std::shared_ptr<model_client> make_echo_model();

} // namespace baton
