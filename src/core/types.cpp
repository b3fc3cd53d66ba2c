#include <baton/json_text.hpp>
#include <baton/types.hpp>

#include <boost/json/parse.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <random>

namespace baton {

time_ms now_ms() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

namespace {
void put_digits(char* out, int value, int width) {
    for (int i = width - 1; i >= 0; --i) {
        out[i] = static_cast<char>('0' + value % 10);
        value /= 10;
    }
}
} // namespace

// Formatted by hand (days to civil date, H. Hinnant's algorithm): every turn record and tape
// entry carries times, and gmtime_r + snprintf cost more than the rest of the record.
std::string format_time(time_ms t) {
    std::int64_t ms = t % 1000, secs = t / 1000;
    if (ms < 0) ms += 1000, secs -= 1;
    std::int64_t days = secs / 86400, rem = secs % 86400;
    if (rem < 0) rem += 86400, days -= 1;
    days += 719468;
    const std::int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    const auto doe = static_cast<unsigned>(days - era * 146097);
    const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const unsigned mp = (5 * doy + 2) / 153;
    const unsigned day = doy - (153 * mp + 2) / 5 + 1;
    const unsigned month = mp < 10 ? mp + 3 : mp - 9;
    const auto year = static_cast<std::int64_t>(yoe) + era * 400 + (month <= 2 ? 1 : 0);
    std::string out = "0000-00-00T00:00:00.000Z";
    put_digits(out.data(), static_cast<int>(year % 10000), 4);
    put_digits(out.data() + 5, static_cast<int>(month), 2);
    put_digits(out.data() + 8, static_cast<int>(day), 2);
    put_digits(out.data() + 11, static_cast<int>(rem / 3600), 2);
    put_digits(out.data() + 14, static_cast<int>(rem / 60 % 60), 2);
    put_digits(out.data() + 17, static_cast<int>(rem % 60), 2);
    put_digits(out.data() + 20, static_cast<int>(ms), 3);
    return out;
}

namespace {
constexpr std::array<std::string_view, 7> status_names{"queued", "running",   "completed", "stopped",
                                                       "failed", "timed_out", "step_limit"};
constexpr std::array<std::string_view, 6> kind_names{"message", "tool_call", "tool_result",
                                                     "anchor",  "event",     "error"};
} // namespace

std::string_view to_string(turn_status s) {
    return status_names[static_cast<std::size_t>(s)];
}

std::optional<turn_status> parse_turn_status(std::string_view s) {
    for (std::size_t i = 0; i < status_names.size(); ++i)
        if (status_names[i] == s) return static_cast<turn_status>(i);
    return std::nullopt;
}

std::string_view to_string(tape_kind k) {
    return kind_names[static_cast<std::size_t>(k)];
}

std::optional<tape_kind> parse_tape_kind(std::string_view s) {
    for (std::size_t i = 0; i < kind_names.size(); ++i)
        if (kind_names[i] == s) return static_cast<tape_kind>(i);
    return std::nullopt;
}

json::object finished_event_data(const turn_record& t) {
    json::object o{{"status", to_string(t.status)},
                   {"reply", t.reply ? json::value(*t.reply) : json::value(nullptr)}};
    if (t.refusal) o["refusal"] = true;
    if (t.error) o["error"] = {{"code", t.error->code}, {"message", t.error->message}};
    return o;
}

void append_turn_json(std::string& out, const turn_record& t) {
    using namespace std::string_view_literals;
    auto time = [&out](time_ms ms) {
        out += '"';
        out += format_time(ms);
        out += '"';
    };
    auto optional = [&](const std::optional<time_ms>& ms) {
        if (ms)
            time(*ms);
        else
            out += "null"sv;
    };
    out += R"({"turn_id":)"sv;
    append_json_string(out, t.turn_id);
    out += R"(,"session_id":)"sv;
    append_json_string(out, t.session_id);
    out += R"(,"agent":)"sv;
    append_json_string(out, t.agent);
    out += R"(,"status":")"sv;
    out += to_string(t.status);
    out += R"(","reply":)"sv;
    if (t.reply)
        append_json_string(out, *t.reply);
    else
        out += "null"sv;
    if (t.refusal) out += R"(,"refusal":true)"sv;
    out += R"(,"steps":)"sv;
    out += std::to_string(t.steps);
    out += R"(,"attempt":)"sv;
    out += std::to_string(t.attempt);
    out += R"(,"usage":{"prompt_tokens":)"sv;
    out += std::to_string(t.usage.prompt_tokens);
    out += R"(,"completion_tokens":)"sv;
    out += std::to_string(t.usage.completion_tokens);
    out += R"(},"error":)"sv;
    if (t.error) {
        out += R"({"code":)"sv;
        append_json_string(out, t.error->code);
        out += R"(,"message":)"sv;
        append_json_string(out, t.error->message);
        out += '}';
    } else {
        out += "null"sv;
    }
    out += R"(,"created_at":)"sv;
    time(t.created_at);
    out += R"(,"started_at":)"sv;
    optional(t.started_at);
    out += R"(,"finished_at":)"sv;
    optional(t.finished_at);
    out += '}';
}

std::string turn_json(const turn_record& t) {
    std::string out;
    out.reserve(256 + t.turn_id.size() + t.session_id.size() + (t.reply ? t.reply->size() : 0));
    append_turn_json(out, t);
    return out;
}

json::object to_json(const turn_record& t) {
    return json::parse(turn_json(t)).as_object();
}

json::object to_json(const tape_entry& e) {
    return {{"id", e.id},
            {"kind", to_string(e.kind)},
            {"payload", e.payload},
            {"created_at", format_time(e.created_at)}};
}

tape_entry make_entry(tape_kind kind, json::object payload) {
    tape_entry e;
    e.kind = kind;
    e.payload = std::move(payload);
    e.created_at = now_ms();
    return e;
}

tape_entry make_message(std::string_view role, std::string_view text) {
    return make_entry(tape_kind::message, {{"role", role}, {"text", text}});
}

tape_entry make_error_entry(std::string_view code, std::string_view message) {
    return make_entry(tape_kind::error, {{"code", code}, {"message", message}});
}

tape_entry make_event_entry(std::string_view name, json::value data) {
    return make_entry(tape_kind::event, {{"name", name}, {"data", std::move(data)}});
}

std::string session_ref::key() const {
    std::string k;
    k.reserve(tenant.size() + 1 + id.size());
    k += tenant;
    k += '/';
    k += id;
    return k;
}

bool valid_tenant_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

bool valid_session_id(std::string_view sid) {
    if (sid.empty() || sid.size() > 128) return false;
    for (char c : sid) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
        if (!ok) return false;
    }
    return true;
}

namespace {
// Crockford base32: URL-safe, sorts like the time it encodes.
constexpr std::string_view id_alphabet = "0123456789abcdefghjkmnpqrstvwxyz";
} // namespace

std::string make_turn_id() {
    thread_local std::mt19937_64 rng{std::random_device{}() ^
                                     static_cast<std::uint64_t>(now_ms()) * 0x9e3779b97f4a7c15ULL};
    thread_local std::uint64_t counter = 0; // per thread: a shared one bounces between cores
    std::uint64_t t = static_cast<std::uint64_t>(now_ms());
    std::uint64_t r1 = rng() ^ counter++;
    std::uint64_t r2 = rng();
    char id[28] = {'t', '_'};
    for (int i = 0; i < 10; ++i)
        id[2 + i] = id_alphabet[(t >> ((9 - i) * 5)) & 31];
    for (int i = 0; i < 8; ++i) {
        id[12 + i] = id_alphabet[(r1 >> (i * 5)) & 31];
        id[20 + i] = id_alphabet[(r2 >> (i * 5)) & 31];
    }
    return std::string(id, sizeof id);
}

namespace {
// The host of HOST:PORT without the brackets of an IPv6 address; nullopt when malformed.
std::optional<std::string_view> listen_host(std::string_view s) {
    std::size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return std::nullopt;
    std::string_view host = s.substr(0, colon), port = s.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stoi(std::string(port)) > 65535)
        return std::nullopt;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
        unsigned char addr[16];
        if (inet_pton(AF_INET6, std::string(host).c_str(), addr) != 1) return std::nullopt;
        return host;
    }
    if (host == "localhost") return host;
    unsigned char addr[4];
    if (inet_pton(AF_INET, std::string(host).c_str(), addr) != 1) return std::nullopt;
    return host;
}
} // namespace

bool valid_listen_address(std::string_view listen) {
    return listen_host(listen).has_value();
}

bool loopback_listen_address(std::string_view listen) {
    auto host = listen_host(listen);
    if (!host) return false;
    if (*host == "localhost") return true;
    if (host->find(':') == std::string_view::npos) return host->starts_with("127.");
    in6_addr a{};
    inet_pton(AF_INET6, std::string(*host).c_str(), &a);
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    // ::ffff:127.x.y.z, the IPv4 loopback as an IPv6 socket sees it.
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
}

bool plausible_turn_id(std::string_view tid) {
    if (tid.size() != 28 || !tid.starts_with("t_")) return false;
    for (char c : tid.substr(2))
        if (id_alphabet.find(c) == std::string_view::npos) return false;
    return true;
}

} // namespace baton
