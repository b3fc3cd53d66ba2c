// TurnState: the per-turn JSON object shared by hooks, tools and event handlers. It lives for one
// turn and is never persisted on its own. Keys beginning `_runtime_` belong to the runtime.
#pragma once

#include <boost/json.hpp>

#include <string_view>

namespace baton {

class turn_state {
public:
    static constexpr std::string_view runtime_prefix = "_runtime_";

    // Plugin writes. Returns false (and writes nothing) for a `_runtime_` key.
    bool set(std::string_view key, boost::json::value v);
    bool erase(std::string_view key);

    const boost::json::value* get(std::string_view key) const { return data_.if_contains(key); }
    const boost::json::object& data() const { return data_; }

    // Runtime writes: any key, including `_runtime_` ones.
    void set_runtime(std::string_view key, boost::json::value v) { data_[key] = std::move(v); }

    static bool reserved(std::string_view key) { return key.starts_with(runtime_prefix); }

private:
    boost::json::object data_;
};

} // namespace baton
