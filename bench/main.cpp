// baton-bench: `pipeline` (in-process turn throughput). More commands arrive with the benchmark
// issue: mock-model, load, memory.
#include "bench/bench.hpp"

#include <exception>

namespace baton::bench {
int run_embedded(const options& opt); // bench/embedded.cpp
}

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
        std::cout << "usage: baton-bench pipeline [--seconds S] [--threads N] [--sessions K]\n"
                     "       baton-bench embedded --model-url URL [--turns T] [--clients C] "
                     "[--warmup W] [--stream 0|1] [--threads N]\n";
        return args.empty() ? 2 : 0;
    }
    std::string cmd = args.front();
    baton::bench::options opt{{args.begin() + 1, args.end()}};
    try {
        if (cmd == "pipeline") return baton::bench::run_pipeline(opt);
        if (cmd == "embedded") return baton::bench::run_embedded(opt);
    } catch (const std::exception& e) {
        std::cerr << "baton-bench: " << e.what() << "\n";
        return 2;
    }
    std::cerr << "baton-bench: unknown command " << cmd << "\n";
    return 2;
}
