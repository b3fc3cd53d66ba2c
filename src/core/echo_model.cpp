#include <baton/model.hpp>

namespace baton {
namespace {

std::int64_t count_words(std::string_view s) {
    std::int64_t n = 0;
    bool in_word = false;
    for (char c : s) {
        bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
        if (!space && !in_word) ++n;
        in_word = !space;
    }
    return n;
}

class echo_model final : public model_client {
public:
    boost::asio::awaitable<chat_completion> complete(const model_request& req,
                                                     const delta_handler& on_delta) override {
        std::string_view last;
        std::int64_t prompt = 0;
        for (const auto& m : req.messages) {
            prompt += count_words(m.content);
            if (m.role == "user") last = m.content;
        }
        chat_completion r;
        r.model = "echo";
        r.text.reserve(6 + last.size());
        r.text.append("echo: ").append(last);
        r.finish_reason = "stop";
        r.prompt_tokens = prompt;
        r.completion_tokens = count_words(r.text);
        r.has_usage = true;
        if (on_delta) on_delta({r.text, {}});
        co_return r;
    }
    std::string name() const override { return "echo"; }
};

} // namespace

std::shared_ptr<model_client> make_echo_model() {
    return std::make_shared<echo_model>();
}

} // namespace baton
