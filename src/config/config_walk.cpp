#include "src/config/config_walk.hpp"

#include <boost/json/basic_parser_impl.hpp>

#include <arpa/inet.h>

#include <algorithm>
#include <set>

namespace baton::detail {

namespace json = boost::json;

namespace {

bool is_plain_key(std::string_view key) {
    return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '-';
    });
}

// A SAX handler that builds nothing: it only tracks the current path to report duplicate keys,
// which json::parse would silently resolve to the last value.
class duplicate_key_finder {
public:
    static constexpr std::size_t max_object_size = std::size_t(-1);
    static constexpr std::size_t max_array_size = std::size_t(-1);
    static constexpr std::size_t max_key_size = std::size_t(-1);
    static constexpr std::size_t max_string_size = std::size_t(-1);

    explicit duplicate_key_finder(config_errors& errors) : errors_(errors) {}

    bool on_document_begin(json::error_code&) { return true; }
    bool on_document_end(json::error_code&) { return true; }
    bool on_array_begin(json::error_code&) { return begin(false); }
    bool on_array_end(std::size_t, json::error_code&) { return end(); }
    bool on_object_begin(json::error_code&) { return begin(true); }
    bool on_object_end(std::size_t, json::error_code&) { return end(); }
    bool on_string_part(json::string_view, std::size_t, json::error_code&) { return true; }
    bool on_string(json::string_view, std::size_t, json::error_code&) { return scalar(); }
    bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
        key_.append(s.data(), s.size());
        return true;
    }
    bool on_key(json::string_view s, std::size_t, json::error_code&) {
        key_.append(s.data(), s.size());
        frame& f = stack_.back();
        f.key = std::move(key_);
        key_.clear();
        if (!f.keys.insert(f.key).second) errors_.push_back({path(), "duplicate key"});
        return true;
    }
    bool on_number_part(json::string_view, json::error_code&) { return true; }
    bool on_int64(std::int64_t, json::string_view, json::error_code&) { return scalar(); }
    bool on_uint64(std::uint64_t, json::string_view, json::error_code&) { return scalar(); }
    bool on_double(double, json::string_view, json::error_code&) { return scalar(); }
    bool on_bool(bool, json::error_code&) { return scalar(); }
    bool on_null(json::error_code&) { return scalar(); }
    bool on_comment_part(json::string_view, json::error_code&) { return true; }
    bool on_comment(json::string_view, json::error_code&) { return true; }

private:
    struct frame {
        bool is_object = false;
        std::set<std::string, std::less<>> keys;
        std::string key;       // current member of an object
        std::size_t index = 0; // current element of an array
    };

    std::string path() const {
        std::string p;
        for (const frame& f : stack_)
            p = f.is_object ? child_path(p, f.key) : index_path(p, f.index);
        return p;
    }
    bool begin(bool is_object) {
        stack_.push_back(frame{is_object, {}, {}, 0});
        return true;
    }
    bool end() {
        stack_.pop_back();
        return scalar();
    }
    bool scalar() {
        if (!stack_.empty() && !stack_.back().is_object) ++stack_.back().index;
        return true;
    }

    config_errors& errors_;
    std::vector<frame> stack_;
    std::string key_;
};

std::string line_column(std::string_view text, std::size_t offset) {
    offset = std::min(offset, text.size());
    std::size_t line = 1;
    std::size_t column = 1;
    for (std::size_t i = 0; i < offset; ++i) {
        if (text[i] == '\n') {
            ++line;
            column = 1;
        } else {
            ++column;
        }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

} // namespace

std::string child_path(std::string_view parent, std::string_view key) {
    std::string p(parent);
    if (is_plain_key(key)) {
        if (!p.empty()) p += '.';
        p += key;
    } else {
        p += '[';
        p += json::serialize(json::string_view(key.data(), key.size()));
        p += ']';
    }
    return p;
}

std::string index_path(std::string_view parent, std::size_t index) {
    return std::string(parent) + "[" + std::to_string(index) + "]";
}

json::value parse_json_strict(std::string_view text, config_errors& errors) {
    json::basic_parser<duplicate_key_finder> checker(json::parse_options{}, errors);
    json::error_code ec;
    std::size_t used = checker.write_some(false, text.data(), text.size(), ec);
    if (!ec && used < text.size()) ec = json::error::extra_data;
    if (ec) {
        errors.push_back({"", "invalid JSON at " + line_column(text, used) + ": " + ec.message()});
        return nullptr;
    }
    return json::parse(json::string_view(text.data(), text.size()));
}

bool read_string(config_errors& errors, const json::value& v, const std::string& path,
                 std::string& out) {
    if (!v.is_string()) {
        errors.push_back({path, "expected string"});
        return false;
    }
    out.assign(v.get_string().data(), v.get_string().size());
    return true;
}

bool read_bool(config_errors& errors, const json::value& v, const std::string& path, bool& out) {
    if (!v.is_bool()) {
        errors.push_back({path, "expected boolean"});
        return false;
    }
    out = v.get_bool();
    return true;
}

bool read_int(config_errors& errors, const json::value& v, const std::string& path, std::int64_t& out,
              std::int64_t min, std::int64_t max) {
    // to_number accepts 1e3 (a double with an exact integer value) but not 1.5 or true.
    json::error_code ec;
    std::int64_t n = v.is_number() ? v.to_number<std::int64_t>(ec) : 0;
    if (!v.is_number() || ec) {
        errors.push_back({path, "expected integer"});
        return false;
    }
    if (n < min || n > max) {
        std::string range =
            max == std::numeric_limits<std::int64_t>::max()
                ? "must be >= " + std::to_string(min)
                : "must be between " + std::to_string(min) + " and " + std::to_string(max);
        errors.push_back({path, std::move(range)});
        return false;
    }
    out = n;
    return true;
}

bool read_number(config_errors& errors, const json::value& v, const std::string& path, double& out) {
    if (!v.is_number()) {
        errors.push_back({path, "expected number"});
        return false;
    }
    out = v.to_number<double>();
    return true;
}

const json::object* as_object(config_errors& errors, const json::value& v, const std::string& path) {
    if (!v.is_object()) errors.push_back({path, "expected object"});
    return v.if_object();
}

const json::array* as_array(config_errors& errors, const json::value& v, const std::string& path) {
    if (!v.is_array()) errors.push_back({path, "expected array"});
    return v.if_array();
}

object_reader::object_reader(config_errors& errors, const json::value& v, std::string path,
                             std::initializer_list<std::string_view> keys)
    : errors_(errors), obj_(as_object(errors, v, path)), path_(std::move(path)) {
    if (obj_ == nullptr) return;
    for (const auto& member : *obj_) {
        std::string_view key(member.key().data(), member.key().size());
        if (std::find(keys.begin(), keys.end(), key) == keys.end())
            errors_.push_back({this->path(key), "unknown key"});
    }
}

const json::value* object_reader::find(std::string_view key) const {
    return obj_ == nullptr ? nullptr : obj_->if_contains(json::string_view(key.data(), key.size()));
}

void object_reader::fail(std::string_view key, std::string message) const {
    errors_.push_back({key.empty() ? path_ : path(key), std::move(message)});
}

bool object_reader::require(std::string_view key) const {
    if (obj_ == nullptr) return false;
    if (!has(key)) fail(key, "required");
    return has(key);
}

bool object_reader::read(std::string_view key, std::string& out) const {
    const json::value* v = find(key);
    return v != nullptr && read_string(errors_, *v, path(key), out);
}

bool object_reader::read_text(std::string_view key, std::string& out) const {
    std::string s;
    if (!read(key, s)) return false;
    if (s.empty()) {
        fail(key, "must not be empty");
        return false;
    }
    out = std::move(s);
    return true;
}

bool object_reader::read(std::string_view key, bool& out) const {
    const json::value* v = find(key);
    return v != nullptr && read_bool(errors_, *v, path(key), out);
}

bool object_reader::read(std::string_view key, std::int64_t& out, std::int64_t min,
                         std::int64_t max) const {
    const json::value* v = find(key);
    return v != nullptr && read_int(errors_, *v, path(key), out, min, max);
}

bool object_reader::read(std::string_view key, std::chrono::milliseconds& out, std::int64_t min) const {
    std::int64_t ms = 0;
    if (!read(key, ms, min)) return false;
    out = std::chrono::milliseconds(ms);
    return true;
}

bool object_reader::read(std::string_view key, std::vector<std::string>& out) const {
    const json::array* a = array(key);
    if (a == nullptr) return false;
    std::vector<std::string> items(a->size());
    bool ok = true;
    for (std::size_t i = 0; i < a->size(); ++i)
        ok = read_string(errors_, (*a)[i], index_path(path(key), i), items[i]) && ok;
    if (ok) out = std::move(items);
    return ok;
}

const json::object* object_reader::object(std::string_view key) const {
    const json::value* v = find(key);
    return v == nullptr ? nullptr : as_object(errors_, *v, path(key));
}

const json::array* object_reader::array(std::string_view key) const {
    const json::value* v = find(key);
    return v == nullptr ? nullptr : as_array(errors_, *v, path(key));
}

bool conninfo_names_password(std::string_view c) {
    for (std::string_view scheme : {"postgresql://", "postgres://"}) {
        if (!c.starts_with(scheme)) continue;
        auto rest = c.substr(scheme.size());
        auto authority = rest.substr(0, rest.find_first_of("/?"));
        auto at = authority.rfind('@');
        if (at != std::string_view::npos && authority.substr(0, at).find(':') != std::string_view::npos)
            return true;
        auto query = rest.find('?');
        if (query == std::string_view::npos) return false;
        for (auto params = rest.substr(query + 1); !params.empty();) {
            auto amp = params.find('&');
            if (params.substr(0, amp).starts_with("password=")) return true;
            params = amp == std::string_view::npos ? std::string_view{} : params.substr(amp + 1);
        }
        return false;
    }
    // Keywords: `password`, then optional spaces and `=`, at the start or after a space.
    for (std::size_t i = c.find("password"); i != std::string_view::npos; i = c.find("password", i + 1)) {
        if (i > 0 && c[i - 1] != ' ' && c[i - 1] != '\t' && c[i - 1] != '\n') continue;
        auto j = c.find_first_not_of(" \t", i + 8);
        if (j != std::string_view::npos && c[j] == '=') return true;
    }
    return false;
}

bool is_http_url(std::string_view s) {
    constexpr std::string_view schemes[] = {"http://", "https://"};
    return std::any_of(std::begin(schemes), std::end(schemes), [s](std::string_view scheme) {
        return s.size() > scheme.size() && s.substr(0, scheme.size()) == scheme;
    });
}

bool is_listen_address(std::string_view s) {
    std::size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    std::string_view host = s.substr(0, colon);
    std::string_view port = s.substr(colon + 1);
    bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
    if (!bracketed &&
        (host.find(':') != std::string_view::npos || host.find_first_of("[] ") != host.npos))
        return false;
    if (port.empty() || port.size() > 5) return false;
    if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return false;
    if (std::stoi(std::string(port)) > 65535) return false;
    // The daemon listens on an address, not a name (it would refuse at start what passed here).
    if (host == "localhost") return true;
    unsigned char addr[16];
    if (bracketed)
        return inet_pton(AF_INET6, std::string(host.substr(1, host.size() - 2)).c_str(), addr) == 1;
    return inet_pton(AF_INET, std::string(host).c_str(), addr) == 1;
}

bool is_loopback_listen(std::string_view s) {
    std::size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) return false;
    std::string_view host = s.substr(0, colon);
    return host == "localhost" || host == "[::1]" || host.starts_with("127.");
}

bool is_session_id(std::string_view s) {
    return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char c) {
        return is_plain_key(std::string_view(&c, 1)) || c == '.' || c == ':' || c == '@';
    });
}

} // namespace baton::detail
