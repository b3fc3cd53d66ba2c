#include <baton/chat_delta.hpp>

#include <boost/json.hpp>

#include <algorithm>
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
    std::int64_t index = 0;
    std::string_view id, name, arguments;
};

struct usage_fields {
    bool present = false;
    std::int64_t prompt = 0, completion = 0;
};

// Everything one chunk says, read and type-checked before any of it is applied.
struct chunk_fields {
    std::string_view id, model, content;
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
        out.arguments = r.str(*fn, "arguments", fn_path).value_or("");
    }
}

usage_fields read_usage(reader& r, const json::object& body) {
    usage_fields u;
    if (auto* o = r.obj(body, "usage", "")) {
        u.present = true;
        u.prompt = r.int64(*o, "prompt_tokens", "usage").value_or(0);
        u.completion = r.int64(*o, "completion_tokens", "usage").value_or(0);
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
    f.content = r.str(*delta, "content", delta_path).value_or("");
    auto* tools = r.arr(*delta, "tool_calls", delta_path);
    if (!tools) return;
    auto tools_path = reader::join(delta_path, "tool_calls");
    for (std::size_t i = 0; i < tools->size() && r.ok(); ++i) {
        auto tool_path = reader::at(tools_path, i);
        auto* t = (*tools)[i].if_object();
        if (!t) return r.fail(tool_path, "expected object");
        tool_fragment frag;
        auto index = r.int64(*t, "index", tool_path);
        if (r.ok() && (!index || *index < 0))
            r.fail(reader::join(tool_path, "index"), "expected integer >= 0");
        frag.index = index.value_or(0);
        read_tool_call(r, *t, tool_path, frag);
        f.tools.push_back(frag);
    }
}

} // namespace

std::string chat_stream_assembler::add(const json::object& chunk, std::string& error) {
    error.clear();
    reader r(error);
    chunk_fields f;
    read_chunk(r, chunk, f);
    if (!r.ok()) return {};

    auto find = [this](std::int64_t index) -> chat_completion::tool_call* {
        auto it = std::lower_bound(indices_.begin(), indices_.end(), index);
        if (it == indices_.end() || *it != index) return nullptr;
        return &result_.tool_calls[it - indices_.begin()];
    };
    // A repeated id or name is normal; a different one would splice two calls together.
    for (std::size_t i = 0; i < f.tools.size(); ++i) {
        const auto& t = f.tools[i];
        std::string_view id, name;
        if (auto* known = find(t.index)) {
            id = known->id;
            name = known->name;
        }
        for (std::size_t j = 0; j < i; ++j) {
            if (f.tools[j].index != t.index) continue;
            if (id.empty()) id = f.tools[j].id;
            if (name.empty()) name = f.tools[j].name;
        }
        auto tool_path = "tool call index " + std::to_string(t.index);
        if (!t.id.empty() && !id.empty() && t.id != id) r.fail(tool_path, "id changed mid-stream");
        if (!t.name.empty() && !name.empty() && t.name != name)
            r.fail(tool_path, "name changed mid-stream");
    }
    if (!r.ok()) return {};

    if (!f.id.empty()) result_.id = f.id;
    if (!f.model.empty()) result_.model = f.model;
    result_.text.append(f.content);
    if (f.finish_reason) result_.finish_reason = *f.finish_reason;
    if (f.usage.present) {
        result_.has_usage = true;
        result_.prompt_tokens = f.usage.prompt;
        result_.completion_tokens = f.usage.completion;
    }
    for (const auto& t : f.tools) {
        auto* call = find(t.index);
        if (!call) {
            // Indices usually arrive in order; keep the vector sorted when they do not.
            auto it = std::lower_bound(indices_.begin(), indices_.end(), t.index);
            auto pos = it - indices_.begin();
            indices_.insert(it, t.index);
            call = &*result_.tool_calls.emplace(result_.tool_calls.begin() + pos);
        }
        if (call->id.empty()) call->id = t.id;
        if (call->name.empty()) call->name = t.name;
        call->arguments.append(t.arguments);
    }
    return std::string(f.content);
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
    c.text = r.str(*message, "content", message_path).value_or("");
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
                {std::string(frag.id), std::string(frag.name), std::string(frag.arguments)});
        }
    }
    if (!r.ok()) return {};
    return c;
}

} // namespace baton
