// Tools the model may call: a registry of C++ tools (registered by embedders), the builtin `clock`
// and HTTP tools from the config. Arguments are checked against each tool's JSON schema before it
// runs; a bad call becomes an error observation for the model, not a failed turn.
#pragma once

#include <baton/model.hpp>
#include <baton/turn_state.hpp>

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace baton {

class http_client;
struct tool_config;

struct tool_result {
    bool ok = true;
    std::string output;
};

struct tool_context {
    std::string session_id;
    std::string turn_id;
    turn_state* state = nullptr;
};

class tool {
public:
    virtual ~tool() = default;
    virtual const tool_schema& schema() const = 0;
    // Runs the tool. Throwing means the tool crashed (the turn ends `failed`, tool_error).
    // Cancellation: follows the awaiting coroutine's slot (tool timeout, turn deadline, cancel).
    virtual boost::asio::awaitable<tool_result> invoke(json::object args, tool_context& ctx) = 0;
};

using tool_function = std::function<boost::asio::awaitable<tool_result>(json::object, tool_context&)>;

std::shared_ptr<tool> make_function_tool(tool_schema schema, tool_function fn);
// `clock`: the current UTC time, RFC 3339.
std::shared_ptr<tool> make_clock_tool();
// `"kind": "http"`: POSTs the arguments as JSON to cfg.url; the response body is the observation
// (a non-2xx status is an error observation).
std::shared_ptr<tool> make_http_tool(std::string name, const tool_config& cfg,
                                     std::shared_ptr<http_client> http);

class tool_registry {
public:
    void add(std::shared_ptr<tool> t);
    std::shared_ptr<tool> find(std::string_view name) const;
    // The schemas of the allowed tools that exist, in allow-list order.
    std::vector<tool_schema> schemas(const std::vector<std::string>& allow) const;

private:
    std::map<std::string, std::shared_ptr<tool>, std::less<>> tools_;
};

// Checks `args` against a JSON schema (type, properties, required, items, enum,
// additionalProperties: false). Returns the first problem with its path, e.g.
// "city: expected string", or nullopt when valid.
std::optional<std::string> validate_arguments(const json::object& schema, const json::value& args);

} // namespace baton
