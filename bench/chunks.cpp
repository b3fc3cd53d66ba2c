// baton-bench chunks: the model client's reading of a streamed answer without I/O: an SSE body
// (a recorded provider stream, say) through sse_parser and chat_stream_assembler, as the OpenAI
// client feeds them, in pieces of the size a socket read brings; CPU per chunk. `--path tree`
// parses every chunk into a JSON tree for add(), bypassing add_common()'s direct reading.
#include "bench/bench.hpp"
#include "bench/measure.hpp"

#include "src/model/chat_delta.hpp"
#include "src/model/sse.hpp"

#include <fstream>
#include <sstream>

namespace baton::bench {

int run_chunks(const options& opt) {
    opt.only({"--stream", "--rounds", "--piece", "--path"});
    const auto mode = opt.value("--path").value_or("client");
    if (mode != "client" && mode != "tree") throw std::invalid_argument("--path is client or tree");
    const bool tree = mode == "tree";
    auto path = opt.value("--stream");
    if (!path) throw std::invalid_argument("--stream FILE is required");
    std::ifstream in(*path, std::ios::binary);
    if (!in) throw std::invalid_argument("cannot read " + *path);
    std::ostringstream buf;
    buf << in.rdbuf();
    const std::string body = buf.str();
    const auto rounds = static_cast<long>(opt.number("--rounds", 200));
    const auto piece = static_cast<std::size_t>(opt.number("--piece", 1400));
    if (rounds < 1 || piece < 1) throw std::invalid_argument("--rounds and --piece must be >= 1");

    std::size_t chunks = 0, text_bytes = 0;
    const double start = self_cpu_us();
    for (long r = 0; r < rounds; ++r) {
        sse_parser parser;
        chat_stream_assembler assembler;
        chunks = 0;
        for (std::size_t at = 0; at < body.size(); at += piece)
            for (auto& ev : parser.feed(std::string_view(body).substr(at, piece))) {
                if (ev.data == "[DONE]") continue;
                std::string error;
                if (!tree) {
                    assembler.add_text(ev.data, error);
                } else {
                    unsigned char scratch[4096];
                    boost::json::monotonic_resource mr(scratch, sizeof scratch);
                    boost::system::error_code ec;
                    auto v = boost::json::parse(ev.data, ec, &mr);
                    if (ec || !v.is_object()) continue;
                    assembler.add(v.get_object(), error);
                }
                ++chunks;
            }
        for (auto& ev : parser.finish())
            (void)ev;
        text_bytes = assembler.take().text.size();
    }
    const double cpu_us = self_cpu_us() - start;
    const double ns = chunks ? cpu_us * 1000.0 / (static_cast<double>(rounds) * chunks) : 0;
    std::cout << chunks << " chunks, " << text_bytes << " bytes of reply; " << ns
              << " ns of CPU a chunk\n";
    boost::json::object out{{"bench", "chunks"},     {"chunks", chunks},          {"rounds", rounds},
                            {"piece", piece},        {"reply_bytes", text_bytes}, {"path", mode},
                            {"cpu_ns_per_chunk", ns}};
    std::cout << boost::json::serialize(out) << "\n";
    return chunks ? 0 : 1;
}

} // namespace baton::bench
