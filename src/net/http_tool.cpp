// `"kind": "http"` tools: the arguments POSTed as JSON, the response body the observation.
#include <baton/config.hpp>
#include <baton/http_client.hpp>
#include <baton/tools.hpp>

#include <boost/beast/core/error.hpp>

namespace baton {

namespace {

class http_tool final : public tool {
public:
    http_tool(std::string name, const tool_config& cfg, std::shared_ptr<http_client> http)
        : url_(cfg.url), timeout_(cfg.timeout), http_(std::move(http)) {
        schema_.name = std::move(name);
        schema_.description = cfg.description;
        schema_.parameters = cfg.parameters;
    }
    const tool_schema& schema() const override { return schema_; }
    boost::asio::awaitable<tool_result> invoke(json::object args, tool_context& ctx) override {
        http_headers headers{{"Content-Type", "application/json"}, {"X-Baton-Turn", ctx.turn_id}};
        auto [ec, res] =
            co_await http_->request("POST", url_, std::move(headers), json::serialize(args), timeout_);
        if (ec == boost::asio::error::operation_aborted) throw boost::system::system_error(ec);
        // Worded as run_tools words tool_timeout_ms: both are the call running out of time.
        if (ec == boost::beast::error::timeout)
            co_return tool_result{false, "tool " + schema_.name + " timed out after " +
                                             std::to_string(timeout_.count()) + " ms"};
        if (ec)
            co_return tool_result{false,
                                  "tool " + schema_.name + " could not be reached: " + ec.message()};
        if (res.status < 200 || res.status > 299)
            co_return tool_result{false, "tool " + schema_.name + " answered HTTP " +
                                             std::to_string(res.status) + ": " + res.body};
        co_return tool_result{true, std::move(res.body)};
    }

private:
    tool_schema schema_;
    std::string url_;
    std::chrono::milliseconds timeout_;
    std::shared_ptr<http_client> http_;
};

} // namespace

std::shared_ptr<tool> make_http_tool(std::string name, const tool_config& cfg,
                                     std::shared_ptr<http_client> http) {
    return std::make_shared<http_tool>(std::move(name), cfg, std::move(http));
}

} // namespace baton
