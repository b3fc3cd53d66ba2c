// The model client's JSON readers: streamed chunks (one JSON value per line, folded in order)
// and a whole non-streamed response. Nothing may crash; an error names a path.
#include "src/model/chat_delta.hpp"

#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view in(reinterpret_cast<const char*>(data), size);
    baton::chat_stream_assembler assembler;
    std::size_t start = 0;
    while (start <= in.size()) {
        auto end = in.find('\n', start);
        if (end == std::string_view::npos) end = in.size();
        boost::system::error_code ec;
        auto v = boost::json::parse(in.substr(start, end - start), ec);
        if (!ec && v.is_object()) {
            std::string error;
            auto added = assembler.add(v.as_object(), error);
            if (!error.empty() && (!added.text.empty() || !added.reasoning.empty())) std::abort();
            std::string error2;
            auto whole = baton::parse_chat_completion(v.as_object(), error2);
            (void)whole;
        }
        start = end + 1;
    }
    auto result = assembler.take();
    (void)result;
    return 0;
}
