// baton-bench: benchmark commands. Each prints human-readable lines and, last, one JSON object.
#pragma once

#include <boost/json.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace baton::bench {

struct options {
    std::vector<std::string> args;
    // `--name VALUE` as a number, or `fallback`.
    double number(const std::string& name, double fallback) const {
        for (std::size_t i = 0; i + 1 < args.size(); ++i)
            if (args[i] == name) return std::stod(args[i + 1]);
        return fallback;
    }
};

inline void print_json(const boost::json::object& o) {
    std::cout << boost::json::serialize(o) << std::endl;
}

int run_pipeline(const options& opt);

} // namespace baton::bench
