// baton-bench: benchmark commands. Each prints human-readable lines and, last, one JSON object.
#pragma once

#include <boost/json.hpp>

#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace baton::bench {

// `--name VALUE` or `--name=VALUE` options and bare `--flag`s, in any order.
struct options {
    std::vector<std::string> args;

    // The value of `--name`, or nullopt when absent.
    std::optional<std::string> value(std::string_view name) const {
        for (std::size_t i = 0; i < args.size(); ++i) {
            std::string_view a = args[i];
            if (a == name) {
                if (i + 1 >= args.size())
                    throw std::invalid_argument(std::string(name) + " needs a value");
                return args[i + 1];
            }
            if (a.size() > name.size() && a.starts_with(name) && a[name.size()] == '=')
                return std::string(a.substr(name.size() + 1));
        }
        return std::nullopt;
    }
    std::string text(std::string_view name, std::string fallback) const {
        auto v = value(name);
        return v ? *v : fallback;
    }
    // `--name VALUE` as a number, or `fallback`; a value that is not a number is an error.
    double number(const std::string& name, double fallback) const {
        auto v = value(name);
        if (!v) return fallback;
        std::size_t used = 0;
        double d = 0;
        try {
            d = std::stod(*v, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != v->size()) throw std::invalid_argument(name + ": expected a number");
        return d;
    }
    bool flag(std::string_view name) const {
        for (const auto& a : args)
            if (a == name) return true;
        return false;
    }
    // Throws on an argument that is neither one of `valued` (with its value) nor one of `flags`.
    void only(std::initializer_list<std::string_view> valued,
              std::initializer_list<std::string_view> flags = {}) const {
        for (std::size_t i = 0; i < args.size(); ++i) {
            std::string_view a = args[i];
            std::string_view name = a.substr(0, a.find('='));
            bool ok = false;
            for (auto v : valued)
                if (name == v) {
                    ok = true;
                    if (name == a) ++i; // the value is the next argument
                }
            for (auto f : flags)
                ok = ok || a == f;
            if (!ok) throw std::invalid_argument("unknown option " + std::string(a));
        }
    }
};

// `key` of a JSON object text, when it is a string; "" otherwise.
inline std::string json_field(std::string_view text, std::string_view key) {
    boost::system::error_code ec;
    auto v = boost::json::parse(text, ec);
    if (ec || !v.is_object()) return {};
    auto f = v.get_object().if_contains(key);
    return f && f->is_string() ? std::string(f->get_string()) : std::string();
}

// `v` with `digits` decimals, for the readable lines.
inline std::string fixed(double v, int digits = 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
}

inline void print_json(const boost::json::object& o) {
    std::cout << boost::json::serialize(o) << std::endl;
}

int run_pipeline(const options& opt);
int run_chunks(const options& opt);
int run_mock_model(const options& opt);
int run_load(const options& opt);
int run_memory(const options& opt);

} // namespace baton::bench
