#include "src/model/chat_delta.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

namespace baton {

namespace json = boost::json;

namespace {

// Typed access to optional members. OpenAI sends `null` for fields a chunk does not carry
// ("content": null beside tool calls, "usage": null before the last chunk), so absent and null
// both read as "not sent"; any other wrong type records the first error with its JSON path.
class reader {
public:
    explicit reader(std::string& error) : error_(error) {}
    bool ok() const { return error_.empty(); }

    void fail(std::string_view path, std::string_view what) {
        if (ok()) error_ = std::string(path) + ": " + std::string(what);
    }

    const json::value* get(const json::object& o, std::string_view key) const {
        auto it = o.find(key);
        return it == o.end() || it->value().is_null() ? nullptr : &it->value();
    }

    std::optional<std::string_view> str(const json::object& o, std::string_view key,
                                        std::string_view path) {
        return typed(o, key, path, "string", [](const json::value& v) {
            auto* s = v.if_string();
            return s ? std::optional<std::string_view>(*s) : std::nullopt;
        });
    }
    const json::object* obj(const json::object& o, std::string_view key, std::string_view path) {
        return typed(o, key, path, "object", [](const json::value& v) { return v.if_object(); });
    }
    const json::array* arr(const json::object& o, std::string_view key, std::string_view path) {
        return typed(o, key, path, "array", [](const json::value& v) { return v.if_array(); });
    }
    std::optional<std::int64_t> int64(const json::object& o, std::string_view key,
                                      std::string_view path) {
        return typed(o, key, path, "integer", [](const json::value& v) {
            boost::system::error_code ec;
            auto n = v.to_number<std::int64_t>(ec);
            return ec ? std::nullopt : std::optional<std::int64_t>(n);
        });
    }

    static std::string join(std::string_view path, std::string_view key) {
        return path.empty() ? std::string(key) : std::string(path) + "." + std::string(key);
    }
    static std::string at(std::string_view path, std::size_t i) {
        return std::string(path) + "[" + std::to_string(i) + "]";
    }

private:
    // `convert` yields an empty result for a value of the wrong type.
    template <class F>
    auto typed(const json::object& o, std::string_view key, std::string_view path,
               std::string_view expected, F convert) -> std::invoke_result_t<F, const json::value&> {
        auto* v = get(o, key);
        if (!v) return {};
        if (auto r = convert(*v)) return r;
        fail(join(path, key), "expected " + std::string(expected));
        return {};
    }

    std::string& error_;
};

struct tool_fragment {
    std::optional<std::int64_t> index; // absent (Mistral): matched by id, see add()
    std::string_view id, name, arguments;
    std::string arguments_text; // `arguments` given as a JSON object, serialized: see text()

    std::string_view text() const { return arguments_text.empty() ? arguments : arguments_text; }
};

struct usage_fields {
    bool present = false;
    std::int64_t prompt = 0, completion = 0;
};

// What a delta or a whole message says besides its tool calls.
struct message_fields {
    std::string text;
    bool refusal = false;
    std::string reasoning;
    std::string_view reasoning_field;
    const json::array* details = nullptr;
};

// Everything one chunk says, read and type-checked before any of it is applied.
struct chunk_fields {
    std::string_view id, model;
    message_fields message;
    std::optional<std::string_view> finish_reason;
    std::vector<tool_fragment> tools;
    usage_fields usage;
};

// Common to a streamed fragment and a complete tool call: {id, type, function: {name, arguments}}.
void read_tool_call(reader& r, const json::object& o, const std::string& path, tool_fragment& out) {
    out.id = r.str(o, "id", path).value_or("");
    if (auto* fn = r.obj(o, "function", path)) {
        auto fn_path = reader::join(path, "function");
        out.name = r.str(*fn, "name", fn_path).value_or("");
        // The contract is a string of JSON; some servers send the object itself.
        if (auto* args = r.get(*fn, "arguments"); args && args->is_object())
            out.arguments_text = json::serialize(*args);
        else
            out.arguments = r.str(*fn, "arguments", fn_path).value_or("");
    }
}

// `usage`, else `x_groq.usage` (older Groq models report it only there).
usage_fields read_usage(reader& r, const json::object& body) {
    usage_fields u;
    const json::object* o = r.obj(body, "usage", "");
    std::string_view path = "usage";
    if (!o) {
        if (auto* groq = r.obj(body, "x_groq", "")) {
            o = r.obj(*groq, "usage", "x_groq");
            path = "x_groq.usage";
        }
    }
    if (o) {
        u.present = true;
        u.prompt = r.int64(*o, "prompt_tokens", path).value_or(0);
        u.completion = r.int64(*o, "completion_tokens", path).value_or(0);
    }
    return u;
}

// The choice with index 0 (we request n = 1). A choice without "index" counts as 0: some
// OpenAI-compatible servers omit it. Null when there is none, as in the final usage chunk.
const json::object* first_choice(reader& r, const json::object& body, std::string& path) {
    auto* choices = r.arr(body, "choices", "");
    if (!choices) return nullptr;
    for (std::size_t i = 0; i < choices->size(); ++i) {
        path = reader::at("choices", i);
        auto* c = (*choices)[i].if_object();
        if (!c) {
            r.fail(path, "expected object");
            return nullptr;
        }
        auto index = r.int64(*c, "index", path);
        if (!r.ok()) return nullptr;
        if (index.value_or(0) == 0) return c;
    }
    return nullptr;
}

// An {"error": {...}} object sent in place of a chunk or a response.
bool read_error_object(reader& r, const json::object& body) {
    auto* e = r.get(body, "error");
    if (!e) return false;
    auto* o = e->if_object();
    auto* m = o ? o->if_contains("message") : nullptr;
    auto message = m && m->is_string() ? std::string(m->get_string()) : json::serialize(*e);
    r.fail("error", message);
    return true;
}

// A "thinking" part's own content: a string, or an array of {"type": "text", "text"} parts.
void read_thinking(reader& r, const json::object& part, const std::string& path, std::string& out) {
    auto* v = r.get(part, "thinking");
    if (!v) return;
    if (auto* s = v->if_string()) {
        out.append(*s);
        return;
    }
    auto* pieces = v->if_array();
    auto thinking_path = reader::join(path, "thinking");
    if (!pieces) return r.fail(thinking_path, "expected string or array");
    for (std::size_t i = 0; i < pieces->size() && r.ok(); ++i) {
        auto* p = (*pieces)[i].if_object();
        if (!p) return r.fail(reader::at(thinking_path, i), "expected object");
        out.append(r.str(*p, "text", reader::at(thinking_path, i)).value_or(""));
    }
}

// `content` as a string, or as an array of parts: "text" parts are the reply, "thinking" parts
// reasoning; parts of other types (images, references) carry neither.
void read_content(reader& r, const json::object& m, const std::string& path, message_fields& f) {
    auto* v = r.get(m, "content");
    if (!v) return;
    if (auto* s = v->if_string()) {
        f.text.append(*s);
        return;
    }
    auto* parts = v->if_array();
    auto content_path = reader::join(path, "content");
    if (!parts) return r.fail(content_path, "expected string or array");
    for (std::size_t i = 0; i < parts->size() && r.ok(); ++i) {
        auto part_path = reader::at(content_path, i);
        auto* part = (*parts)[i].if_object();
        if (!part) return r.fail(part_path, "expected object");
        auto type = r.str(*part, "type", part_path).value_or("");
        if (type == "text")
            f.text.append(r.str(*part, "text", part_path).value_or(""));
        else if (type == "thinking")
            read_thinking(r, *part, part_path, f.reasoning);
    }
}

// The readable text of reasoning_details pieces, for a provider that sent no other.
void details_text(const json::array& details, std::string& out) {
    for (const auto& item : details) {
        auto* o = item.if_object();
        if (!o) continue;
        for (std::string_view key : {"text", "summary"})
            if (auto* t = o->if_contains(key); t && t->is_string()) out.append(t->get_string());
    }
}

// A delta or a message: content (string or parts), refusal, reasoning and reasoning_details.
void read_message(reader& r, const json::object& m, const std::string& path, message_fields& f) {
    read_content(r, m, path, f);
    // The other fields are rare: one pass over the (small) object finds whichever are there.
    const json::value *refusal = nullptr, *reasoning_content = nullptr, *reasoning = nullptr;
    for (const auto& kv : m) {
        auto key = kv.key();
        if (key.size() < 7 || kv.value().is_null()) continue;
        if (key == "refusal")
            refusal = &kv.value();
        else if (key == "reasoning_content")
            reasoning_content = &kv.value();
        else if (key == "reasoning")
            reasoning = &kv.value();
        else if (key == "reasoning_details")
            f.details = r.arr(m, key, path);
    }
    if (refusal) {
        if (auto text = r.str(m, "refusal", path); text && !text->empty()) {
            f.text.append(*text);
            f.refusal = true;
        }
    }
    // vLLM sends both names for one text: the first that carries any is the one.
    for (auto [field, v] : {std::pair{std::string_view("reasoning_content"), reasoning_content},
                            std::pair{std::string_view("reasoning"), reasoning}}) {
        if (!v) continue;
        auto text = r.str(m, field, path);
        if (!text || text->empty()) continue;
        f.reasoning.append(*text);
        f.reasoning_field = field;
        break;
    }
    if (f.details && f.reasoning_field.empty() && f.reasoning.empty())
        details_text(*f.details, f.reasoning);
}

void read_chunk(reader& r, const json::object& chunk, chunk_fields& f) {
    if (read_error_object(r, chunk)) return;
    f.id = r.str(chunk, "id", "").value_or("");
    f.model = r.str(chunk, "model", "").value_or("");
    f.usage = read_usage(r, chunk);
    std::string path;
    auto* choice = first_choice(r, chunk, path);
    if (!choice) return;
    f.finish_reason = r.str(*choice, "finish_reason", path);
    auto* delta = r.obj(*choice, "delta", path);
    if (!delta) return;
    auto delta_path = reader::join(path, "delta");
    read_message(r, *delta, delta_path, f.message);
    auto* tools = r.arr(*delta, "tool_calls", delta_path);
    if (!tools) return;
    auto tools_path = reader::join(delta_path, "tool_calls");
    for (std::size_t i = 0; i < tools->size() && r.ok(); ++i) {
        auto tool_path = reader::at(tools_path, i);
        auto* t = (*tools)[i].if_object();
        if (!t) return r.fail(tool_path, "expected object");
        tool_fragment frag;
        frag.index = r.int64(*t, "index", tool_path);
        if (r.ok() && frag.index && *frag.index < 0)
            r.fail(reader::join(tool_path, "index"), "expected integer >= 0");
        read_tool_call(r, *t, tool_path, frag);
        f.tools.push_back(frag);
    }
}

void apply_message(chat_completion& c, message_fields& f) {
    c.text.append(f.text);
    if (f.refusal) c.refusal = true;
    c.reasoning.text.append(f.reasoning);
    if (c.reasoning.field.empty()) c.reasoning.field = f.reasoning_field;
}

// Reads the text of a common chunk without building its JSON tree (add_common()). It accepts a
// subset of what boost::json::parse accepts, and whenever it cannot be sure that parse and add()
// would agree, it gives up (returns false) and the caller takes the slow path: a non-ASCII byte
// (UTF-8 is validated there), a \u escape, a number with an exponent or of more than 40 digits,
// nesting deeper than 16, any syntax error.
class chunk_scanner {
public:
    explicit chunk_scanner(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}

    void space() {
        while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r'))
            ++p_;
    }
    bool eat(char c) {
        space();
        if (p_ == end_ || *p_ != c) return false;
        ++p_;
        return true;
    }
    bool next_is(char c) {
        space();
        return p_ != end_ && *p_ == c;
    }
    bool at_end() {
        space();
        return p_ == end_;
    }
    bool null() {
        space();
        if (end_ - p_ < 4 || std::string_view(p_, 4) != "null") return false;
        p_ += 4;
        return true;
    }

    // A string at the cursor. Its raw text goes to `raw`; when `decoded` is given it receives
    // the value with its (simple) escapes undone, and `raw` is then the decoded view.
    bool string(std::string_view& raw, std::string* decoded) {
        if (!eat('"')) return false;
        const char* start = p_;
        bool escaped = false;
        for (;; ++p_) {
            skip_plain();
            if (p_ == end_) return false;
            auto c = static_cast<unsigned char>(*p_);
            if (c == '"') break;
            if (c < 0x20 || c >= 0x80) return false;
            if (c != '\\') continue;
            escaped = true;
            if (++p_ == end_) return false;
            switch (*p_) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                break;
            default:
                return false; // \u, or not an escape at all
            }
        }
        raw = std::string_view(start, static_cast<std::size_t>(p_ - start));
        ++p_;
        if (!decoded || !escaped) return true;
        decoded->clear();
        for (std::size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] != '\\') {
                decoded->push_back(raw[i]);
                continue;
            }
            switch (raw[++i]) {
            case 'b':
                decoded->push_back('\b');
                break;
            case 'f':
                decoded->push_back('\f');
                break;
            case 'n':
                decoded->push_back('\n');
                break;
            case 'r':
                decoded->push_back('\r');
                break;
            case 't':
                decoded->push_back('\t');
                break;
            default:
                decoded->push_back(raw[i]);
                break; // " \ /
            }
        }
        raw = *decoded;
        return true;
    }

    // The literal 0 (an index).
    bool zero() {
        space();
        if (p_ == end_ || *p_ != '0') return false;
        ++p_;
        return p_ == end_ || !is_number_char(*p_);
    }

    // A token count: 0 or [1-9][0-9]* of at most 18 digits (so that it fits an int64 as
    // boost::json reads it), not followed by a fraction or an exponent.
    bool count(std::int64_t& n) {
        space();
        if (p_ == end_ || !digit(*p_)) return false;
        n = 0;
        int digits = 0;
        if (*p_ == '0') {
            ++p_;
        } else {
            for (; p_ != end_ && digit(*p_); ++p_) {
                if (++digits > 18) return false;
                n = n * 10 + (*p_ - '0');
            }
        }
        return p_ == end_ || !is_number_char(*p_);
    }

    // Any value, checked but not kept.
    bool skip(int depth = 0) {
        space();
        if (p_ == end_ || depth > 16) return false;
        switch (*p_) {
        case '"': {
            std::string_view ignored;
            return string(ignored, nullptr);
        }
        case '{': {
            ++p_;
            if (eat('}')) return true;
            do {
                std::string_view key;
                if (!string(key, nullptr) || !eat(':') || !skip(depth + 1)) return false;
            } while (eat(','));
            return eat('}');
        }
        case '[': {
            ++p_;
            if (eat(']')) return true;
            do {
                if (!skip(depth + 1)) return false;
            } while (eat(','));
            return eat(']');
        }
        case 't':
            return literal("true");
        case 'f':
            return literal("false");
        case 'n':
            return literal("null");
        default:
            return number();
        }
    }

    // The members of an object at the cursor: `member(key)` reads each value (or skips it) and
    // returns false to give up.
    template <class F> bool members(F member) {
        if (!eat('{')) return false;
        if (eat('}')) return true;
        do {
            std::string_view key;
            if (!string(key, nullptr) || !eat(':') || !member(key)) return false;
        } while (eat(','));
        return eat('}');
    }

private:
    // Moves the cursor over plain string bytes, eight at a time while eight remain, to the first
    // quote, backslash, control character or non-ASCII byte (or to the last few bytes). Of the
    // bytes each test flags, the lowest is always right: a false flag only follows a true one.
    void skip_plain() {
        constexpr std::uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
        auto zero_bytes = [](std::uint64_t x) { return (x - ones) & ~x & highs; };
        while (end_ - p_ >= 8) {
            std::uint64_t v;
            std::memcpy(&v, p_, 8);
            if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
            const std::uint64_t look = (v & highs) | ((v - ones * 0x20) & ~v & highs) |
                                       zero_bytes(v ^ (ones * '"')) | zero_bytes(v ^ (ones * '\\'));
            if (look != 0) {
                p_ += std::countr_zero(look) / 8;
                return;
            }
            p_ += 8;
        }
    }
    static std::uint64_t byteswap(std::uint64_t v) {
        std::uint64_t r = 0;
        for (int i = 0; i < 8; ++i, v >>= 8)
            r = (r << 8) | (v & 0xff);
        return r;
    }
    static bool is_number_char(char c) {
        return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
    }
    static bool digit(char c) { return c >= '0' && c <= '9'; }

    bool literal(std::string_view word) {
        if (static_cast<std::size_t>(end_ - p_) < word.size() ||
            std::string_view(p_, word.size()) != word)
            return false;
        p_ += word.size();
        return true;
    }

    // -?(0|[1-9][0-9]*)(.[0-9]+)?, at most 40 digits: always a finite double to boost::json.
    bool number() {
        int digits = 0;
        if (p_ != end_ && *p_ == '-') ++p_;
        if (p_ == end_ || !digit(*p_)) return false;
        if (*p_ == '0') {
            ++p_;
            ++digits;
        } else {
            for (; p_ != end_ && digit(*p_); ++p_)
                ++digits;
        }
        if (p_ != end_ && *p_ == '.') {
            ++p_;
            if (p_ == end_ || !digit(*p_)) return false;
            for (; p_ != end_ && digit(*p_); ++p_)
                ++digits;
        }
        if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) return false;
        return digits <= 40;
    }

    const char* p_;
    const char* end_;
};

} // namespace

chunk_delta chat_stream_assembler::add(const json::object& chunk, std::string& error) {
    error.clear();
    reader r(error);
    chunk_fields f;
    read_chunk(r, chunk, f);
    if (!r.ok()) return {};

    // Fragments without an index: a new id starts the next call, no id continues the last one.
    std::int64_t next = indices_.empty() ? 0 : indices_.back() + 1;
    std::optional<std::int64_t> last;
    if (!result_.tool_calls.empty()) last = indices_[last_call_];
    std::vector<std::int64_t> resolved(f.tools.size());
    for (std::size_t i = 0; i < f.tools.size(); ++i) {
        auto& t = f.tools[i];
        if (t.index) {
            resolved[i] = *t.index;
            next = std::max(next, *t.index + 1);
        } else {
            std::optional<std::int64_t> known;
            if (!t.id.empty()) {
                for (std::size_t k = 0; k < result_.tool_calls.size() && !known; ++k)
                    if (result_.tool_calls[k].id == t.id) known = indices_[k];
                for (std::size_t j = 0; j < i && !known; ++j)
                    if (f.tools[j].id == t.id) known = resolved[j];
            }
            if (known)
                resolved[i] = *known;
            else if (t.id.empty() && last)
                resolved[i] = *last;
            else
                resolved[i] = next++;
        }
        last = resolved[i];
    }

    auto find = [this](std::int64_t index) -> std::optional<std::size_t> {
        auto it = std::lower_bound(indices_.begin(), indices_.end(), index);
        if (it == indices_.end() || *it != index) return std::nullopt;
        return static_cast<std::size_t>(it - indices_.begin());
    };
    // A repeated id or name is normal; a different one would splice two calls together.
    for (std::size_t i = 0; i < f.tools.size(); ++i) {
        const auto& t = f.tools[i];
        std::string_view id, name;
        if (auto known = find(resolved[i])) {
            id = result_.tool_calls[*known].id;
            name = result_.tool_calls[*known].name;
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (resolved[j] != resolved[i]) continue;
            if (id.empty()) id = f.tools[j].id;
            if (name.empty()) name = f.tools[j].name;
        }
        auto tool_path = "tool call index " + std::to_string(resolved[i]);
        if (!t.id.empty() && !id.empty() && t.id != id) r.fail(tool_path, "id changed mid-stream");
        if (!t.name.empty() && !name.empty() && t.name != name)
            r.fail(tool_path, "name changed mid-stream");
    }
    if (!r.ok()) return {};

    if (!f.id.empty()) result_.id = f.id;
    if (!f.model.empty()) result_.model = f.model;
    apply_message(result_, f.message);
    if (f.message.details) merge_reasoning_details(result_.reasoning.details, *f.message.details);
    if (f.finish_reason) result_.finish_reason = *f.finish_reason;
    if (f.usage.present) {
        result_.has_usage = true;
        result_.prompt_tokens = f.usage.prompt;
        result_.completion_tokens = f.usage.completion;
    }
    for (std::size_t i = 0; i < f.tools.size(); ++i) {
        const auto& t = f.tools[i];
        auto pos = find(resolved[i]);
        if (!pos) {
            // Indices usually arrive in order; keep the vector sorted when they do not.
            auto it = std::lower_bound(indices_.begin(), indices_.end(), resolved[i]);
            pos = static_cast<std::size_t>(it - indices_.begin());
            indices_.insert(it, resolved[i]);
            result_.tool_calls.emplace(result_.tool_calls.begin() + static_cast<std::ptrdiff_t>(*pos));
        }
        auto& call = result_.tool_calls[*pos];
        if (call.id.empty()) call.id = t.id;
        if (call.name.empty()) call.name = t.name;
        call.arguments.append(t.text());
        last_call_ = *pos;
    }
    return {std::move(f.message.text), std::move(f.message.reasoning)};
}

bool chat_stream_assembler::add_common(std::string_view chunk, chunk_delta& out, std::string& error) {
    chunk_scanner s(chunk);
    std::string_view id, model, finish_reason, content;
    bool has_finish = false;
    std::string decoded;
    unsigned seen = 0; // the fields read, each once: a repeated one is left to boost::json
    auto once = [&seen](unsigned bit) {
        if (seen & bit) return false;
        seen |= bit;
        return true;
    };
    auto string_or_null = [&s](std::string_view& v, std::string* into) {
        return s.null() || s.string(v, into);
    };
    // Fields add() reads and must be null here (anything else: the slow path).
    auto must_be_null = [&](unsigned bit) { return once(bit) && s.null(); };

    auto delta = [&](std::string_view key) {
        if (key == "content") return once(1u << 0) && string_or_null(content, &decoded);
        if (key == "refusal") return must_be_null(1u << 1);
        if (key == "reasoning_content") return must_be_null(1u << 2);
        if (key == "reasoning") return must_be_null(1u << 3);
        if (key == "reasoning_details") return must_be_null(1u << 4);
        if (key == "tool_calls") return must_be_null(1u << 5);
        return s.skip(2);
    };
    // As read_usage: a count or null (0), other members skipped.
    bool has_usage = false;
    std::int64_t prompt_tokens = 0, completion_tokens = 0;
    auto count_or_null = [&s](std::int64_t& n) { return s.null() || s.count(n); };
    auto usage = [&](std::string_view key) {
        if (key == "prompt_tokens") return once(1u << 15) && count_or_null(prompt_tokens);
        if (key == "completion_tokens") return once(1u << 16) && count_or_null(completion_tokens);
        return s.skip(1);
    };
    auto choice = [&](std::string_view key) {
        if (key == "index") return once(1u << 6) && (s.null() || s.zero());
        if (key == "finish_reason") {
            if (!once(1u << 7)) return false;
            if (s.null()) return true;
            has_finish = true;
            return s.string(finish_reason, nullptr);
        }
        if (key == "delta") return once(1u << 8) && (s.null() || s.members(delta));
        return s.skip(1);
    };
    auto top = [&](std::string_view key) {
        if (key == "id") return once(1u << 9) && string_or_null(id, nullptr);
        if (key == "model") return once(1u << 10) && string_or_null(model, nullptr);
        if (key == "usage") {
            if (!once(1u << 11)) return false;
            if (s.null()) return true;
            has_usage = true;
            return s.members(usage);
        }
        if (key == "error") return must_be_null(1u << 12);
        if (key == "x_groq") return must_be_null(1u << 13);
        if (key == "choices") {
            if (!once(1u << 14)) return false;
            if (s.null()) return true;
            if (!s.eat('[')) return false;
            if (s.eat(']')) return true;
            return s.next_is('{') && s.members(choice) && s.eat(']'); // one choice only
        }
        return s.skip();
    };
    // An id or a model could hold an escape: then they would need decoding, which is rare.
    if (!s.members(top) || !s.at_end()) return false;
    if (id.find('\\') != std::string_view::npos || model.find('\\') != std::string_view::npos ||
        finish_reason.find('\\') != std::string_view::npos)
        return false;

    error.clear();
    if (!id.empty()) result_.id = id;
    if (!model.empty()) result_.model = model;
    result_.text.append(content);
    if (has_finish) result_.finish_reason = finish_reason;
    if (has_usage) {
        result_.has_usage = true;
        result_.prompt_tokens = prompt_tokens;
        result_.completion_tokens = completion_tokens;
    }
    out = {std::string(content), {}};
    return true;
}

chunk_delta chat_stream_assembler::add_text(std::string_view chunk, std::string& error) {
    chunk_delta d;
    if (add_common(chunk, d, error)) return d;
    // A chunk is small and dies here: parse it into a buffer on the stack.
    unsigned char scratch[4096];
    json::monotonic_resource mr(scratch, sizeof scratch);
    boost::system::error_code ec;
    auto v = json::parse(chunk, ec, &mr);
    if (ec || !v.is_object()) {
        error = "a stream event is not a JSON object";
        return {};
    }
    return add(v.get_object(), error);
}

void merge_reasoning_details(json::array& into, const json::array& piece) {
    for (const auto& item : piece) {
        const auto* o = item.if_object();
        const json::value* index = o ? o->if_contains("index") : nullptr;
        const json::value* type = o ? o->if_contains("type") : nullptr;
        json::object* same = nullptr;
        for (auto& have : into) {
            auto* h = have.if_object();
            auto* hi = h ? h->if_contains("index") : nullptr;
            auto* ht = h ? h->if_contains("type") : nullptr;
            if (index && hi && *hi == *index && (!type || !ht || *ht == *type)) same = h;
        }
        if (!same) {
            into.push_back(item);
            continue;
        }
        for (const auto& [key, value] : *o) {
            auto* old = same->if_contains(key);
            const bool appended = key == "text" || key == "summary" || key == "data";
            if (old && appended && old->is_string() && value.is_string())
                old->get_string().append(value.get_string());
            else if (!old || old->is_null() || (old->is_string() && old->get_string().empty()))
                (*same)[key] = value;
        }
    }
}

chat_completion parse_chat_completion(const json::object& body, std::string& error) {
    error.clear();
    reader r(error);
    chat_completion c;
    if (read_error_object(r, body)) return {};
    c.id = r.str(body, "id", "").value_or("");
    c.model = r.str(body, "model", "").value_or("");
    auto u = read_usage(r, body);
    c.has_usage = u.present;
    c.prompt_tokens = u.prompt;
    c.completion_tokens = u.completion;
    std::string path;
    auto* choice = first_choice(r, body, path);
    if (!r.ok()) return {};
    if (!choice) {
        r.fail("choices", "no choice with index 0");
        return {};
    }
    c.finish_reason = r.str(*choice, "finish_reason", path).value_or("");
    auto* message = r.obj(*choice, "message", path);
    auto message_path = reader::join(path, "message");
    if (!message) {
        r.fail(message_path, "missing");
        return {};
    }
    message_fields f;
    read_message(r, *message, message_path, f);
    apply_message(c, f);
    if (f.details) c.reasoning.details = *f.details;
    if (auto* tools = r.arr(*message, "tool_calls", message_path)) {
        auto tools_path = reader::join(message_path, "tool_calls");
        for (std::size_t i = 0; i < tools->size() && r.ok(); ++i) {
            auto tool_path = reader::at(tools_path, i);
            auto* t = (*tools)[i].if_object();
            if (!t) {
                r.fail(tool_path, "expected object");
                break;
            }
            tool_fragment frag;
            read_tool_call(r, *t, tool_path, frag);
            c.tool_calls.push_back(
                {std::string(frag.id), std::string(frag.name), std::string(frag.text())});
        }
    }
    if (!r.ok()) return {};
    return c;
}

} // namespace baton
