#include <baton/command.hpp>

namespace baton {

namespace {
bool blank(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && blank(s.front()))
        s.remove_prefix(1);
    while (!s.empty() && blank(s.back()))
        s.remove_suffix(1);
    return s;
}
} // namespace

std::optional<direct_command> parse_command(std::string_view text) {
    text = trim(text);
    if (!text.starts_with('/')) return std::nullopt;
    std::size_t end = 0;
    while (end < text.size() && !blank(text[end]))
        ++end;
    return direct_command{text.substr(0, end), trim(text.substr(end))};
}

bool is_stop_command(std::string_view text) {
    auto c = parse_command(text);
    return c && c->word == "/stop";
}

} // namespace baton
