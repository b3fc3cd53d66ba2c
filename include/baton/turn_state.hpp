// TurnState: the per-turn JSON object shared by hooks, tools and event handlers. It lives for one
// turn and is never persisted on its own. Keys beginning `_runtime_` belong to the runtime.
#pragma once

#include <boost/json.hpp>

#include <string>
#include <string_view>

namespace baton {

class turn_state {
public:
    static constexpr std::string_view runtime_prefix = "_runtime_";

    // Plugin writes. Returns false (and writes nothing) for a `_runtime_` key.
    bool set(std::string_view key, boost::json::value v);
    bool erase(std::string_view key);

    const boost::json::value* get(std::string_view key) const { return data().if_contains(key); }
    const boost::json::object& data() const {
        if (pending_) materialize();
        return data_;
    }

    // Runtime writes: any key, including `_runtime_` ones.
    void set_runtime(std::string_view key, boost::json::value v) {
        if (pending_) materialize();
        data_[key] = std::move(v);
    }
    // `_runtime_turn_id` / `_runtime_session_id` read from these strings (which outlive the state)
    // when a hook first looks: most turns never do, and then the keys cost nothing.
    void bind_turn_id(const std::string* id) { bind(turn_id_, id); }
    void bind_session_id(const std::string* id) { bind(session_id_, id); }

    static bool reserved(std::string_view key) { return key.starts_with(runtime_prefix); }

private:
    struct binding {
        const std::string* source = nullptr;
        bool written = false;
    };
    void bind(binding& b, const std::string* id) {
        b = {id, false};
        pending_ = true;
    }
    void materialize() const;

    mutable boost::json::object data_;
    mutable binding turn_id_, session_id_;
    mutable bool pending_ = false;
};

} // namespace baton
