#include <baton/tools.hpp>

namespace baton {

namespace {

class function_tool final : public tool {
public:
    function_tool(tool_schema s, tool_function f) : schema_(std::move(s)), fn_(std::move(f)) {}
    const tool_schema& schema() const override { return schema_; }
    boost::asio::awaitable<tool_result> invoke(json::object args, tool_context& ctx) override {
        co_return co_await fn_(std::move(args), ctx);
    }

private:
    tool_schema schema_;
    tool_function fn_;
};

std::string_view type_of(const json::value& v) {
    switch (v.kind()) {
    case json::kind::null:
        return "null";
    case json::kind::bool_:
        return "boolean";
    case json::kind::int64:
    case json::kind::uint64:
        return "integer";
    case json::kind::double_:
        return "number";
    case json::kind::string:
        return "string";
    case json::kind::array:
        return "array";
    case json::kind::object:
        return "object";
    }
    return "unknown";
}

bool has_type(const json::value& v, std::string_view type) {
    auto actual = type_of(v);
    if (type == "number") return actual == "integer" || actual == "number";
    if (type == "integer" && v.is_double()) {
        double d = v.get_double();
        return d == static_cast<double>(static_cast<std::int64_t>(d));
    }
    return actual == type;
}

std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::optional<std::string> check(const json::object& schema, const json::value& v,
                                 const std::string& path) {
    const std::string where = path.empty() ? "arguments" : path;
    if (auto* t = schema.if_contains("type")) {
        bool ok = false;
        std::string wanted;
        auto test = [&](const json::value& one) {
            if (!one.is_string()) return;
            if (!wanted.empty()) wanted += " or ";
            wanted += one.get_string();
            ok = ok || has_type(v, one.get_string());
        };
        if (t->is_array())
            for (auto& one : t->get_array())
                test(one);
        else
            test(*t);
        if (!wanted.empty() && !ok) return where + ": expected " + wanted;
    }
    if (auto* e = schema.if_contains("enum"); e && e->is_array()) {
        bool found = false;
        for (auto& option : e->get_array())
            found = found || option == v;
        if (!found) return where + ": not one of the allowed values";
    }
    if (v.is_object()) {
        const auto& obj = v.get_object();
        const json::object* props = nullptr;
        if (auto* p = schema.if_contains("properties"); p && p->is_object()) props = &p->get_object();
        if (auto* req = schema.if_contains("required"); req && req->is_array())
            for (auto& name : req->get_array())
                if (name.is_string() && !obj.contains(name.get_string()))
                    return join(path, name.get_string()) + ": required";
        bool closed = false;
        if (auto* ap = schema.if_contains("additionalProperties"); ap && ap->is_bool())
            closed = !ap->get_bool();
        for (auto& kv : obj) {
            const json::value* sub = props ? props->if_contains(kv.key()) : nullptr;
            if (!sub) {
                if (closed) return join(path, kv.key()) + ": unknown property";
                continue;
            }
            if (sub->is_object())
                if (auto err = check(sub->get_object(), kv.value(), join(path, kv.key()))) return err;
        }
    }
    if (v.is_array()) {
        if (auto* items = schema.if_contains("items"); items && items->is_object()) {
            const auto& arr = v.get_array();
            for (std::size_t i = 0; i < arr.size(); ++i)
                if (auto err = check(items->get_object(), arr[i], where + "[" + std::to_string(i) + "]"))
                    return err;
        }
    }
    return std::nullopt;
}

} // namespace

std::shared_ptr<tool> make_function_tool(tool_schema schema, tool_function fn) {
    return std::make_shared<function_tool>(std::move(schema), std::move(fn));
}

std::shared_ptr<tool> make_clock_tool() {
    tool_schema s{"clock", "The current date and time in UTC (RFC 3339).",
                  json::object{{"type", "object"}, {"properties", json::object{}}}};
    return make_function_tool(std::move(s),
                              [](json::object, tool_context&) -> boost::asio::awaitable<tool_result> {
                                  co_return tool_result{true, format_time(now_ms())};
                              });
}

void tool_registry::add(std::shared_ptr<tool> t) {
    auto name = t->schema().name;
    tools_.insert_or_assign(std::move(name), std::move(t));
}

std::shared_ptr<tool> tool_registry::find(std::string_view name) const {
    auto it = tools_.find(name);
    return it == tools_.end() ? nullptr : it->second;
}

std::vector<tool_schema> tool_registry::schemas(const std::vector<std::string>& allow) const {
    std::vector<tool_schema> out;
    for (const auto& name : allow)
        if (auto t = find(name)) out.push_back(t->schema());
    return out;
}

std::optional<std::string> validate_arguments(const json::object& schema, const json::value& args) {
    return check(schema, args, "");
}

} // namespace baton
