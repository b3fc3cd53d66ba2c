// baton-bench: pipeline (in-process turn throughput), embedded (baton as a library against an
// OpenAI-compatible server, for bench/peers/run), mock-model (a fast OpenAI-compatible server), load
// (closed-loop load against a running daemon), memory (the daemon's RSS per session and connection).
#include "bench/bench.hpp"

#include <exception>

namespace baton::bench {
int run_embedded(const options& opt); // bench/embedded.cpp
int run_soak(const options& opt);     // bench/soak.cpp
} // namespace baton::bench

namespace {
const char* usage_text = R"(usage: baton-bench <command> [options]

  pipeline [--seconds S] [--threads N] [--sessions K] [--store memory|sqlite] [--session-length N]
           [--context-window T] [--io shared|per-thread] [--pin 0|1]
      turns through the seven-stage pipeline in-process (memory store, null model, a context
      window of T tokens, default 8192); with --session-length, N turns in one session: first
      100 against last 100, wall and CPU time, on one core unless --pin 0
  mock-model [--listen HOST:PORT] [--delay-ms D] [--threads N] [--chunks K] [--reasoning]
      a deterministic OpenAI-compatible chat-completions server (default 127.0.0.1:0); prints
      `listening on http://HOST:PORT`; stops on SIGINT/SIGTERM and prints its request count
  load [--url URL] [--clients C] [--sessions K] [--turns N] [--seconds S] [--mode poll|sse|ws]
       [--pid PID] [--text T] [--warmup N] [--threads N] [--timeout-ms T] [--token TOKEN]
       [--session-prefix P]
      closed-loop load against a running daemon (default http://127.0.0.1:8080, 50 clients,
      K = C sessions, 10000 turns); with --pid, the daemon's CPU per turn and RSS; with --token,
      every request and upgrade carries it as a bearer token.
      Exit 0 without errors, 1 with errors, 2 on misuse or an unsupported endpoint
  chunks --stream FILE [--rounds N] [--piece B] [--path client|tree]
      the model client's reading of a streamed answer (an SSE body, e.g. a recorded provider
      stream) without I/O: SSE parser and chunk assembly in B-byte reads (1400); CPU per chunk;
      --path tree parses every chunk into a JSON tree (the client reads common chunks directly)
  memory [--baton PATH] [--sessions N] [--connections M]
      starts `baton serve` on a temp dir and measures its idle RSS, RSS per idle session
      (default 10000) and per WebSocket connection (default 10000)
  soak [--minutes M] [--baton PATH] [--clients C] [--rate R] [--warmup-s W] [--measure-s S]
       [--bucket-s B] [--context-window T]
      starts the mock model and `baton serve` (SQLite, bearer tokens of two tenants with limits,
      a context window of T tokens (4096) that sessions reach during the warm-up),
      measures the closed-loop turns/s of C clients (50) for S s (15), then paces them at R (half
      of that): a W s warm-up (60), then M minutes (10), reporting every B s (60) turns, errors,
      p50/p99 and RSS. Exit 0 when there were 0 errors and RSS ended within 5 % of its value
      after the warm-up
  embedded --model-url URL [--turns T] [--clients C] [--warmup W] [--stream 0|1] [--threads N]
      baton as a library: C sessions run T turns (model call, `lookup` tool, model call) against
      an OpenAI-compatible server (the mock); this process's CPU per turn (bench/peers/run)

Each command prints readable lines and, last, one JSON object on one line.
)";
} // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
        (args.empty() ? std::cerr : std::cout) << usage_text;
        return args.empty() ? 2 : 0;
    }
    std::string cmd = args.front();
    baton::bench::options opt{{args.begin() + 1, args.end()}};
    if (opt.flag("--help") || opt.flag("-h")) {
        std::cout << usage_text;
        return 0;
    }
    try {
        if (cmd == "pipeline") return baton::bench::run_pipeline(opt);
        if (cmd == "mock-model") return baton::bench::run_mock_model(opt);
        if (cmd == "chunks") return baton::bench::run_chunks(opt);
        if (cmd == "load") return baton::bench::run_load(opt);
        if (cmd == "memory") return baton::bench::run_memory(opt);
        if (cmd == "embedded") return baton::bench::run_embedded(opt);
        if (cmd == "soak") return baton::bench::run_soak(opt);
    } catch (const std::exception& e) {
        std::cerr << "baton-bench " << cmd << ": " << e.what() << "\n";
        return 2;
    }
    std::cerr << "baton-bench: unknown command " << cmd << "\n" << usage_text;
    return 2;
}
