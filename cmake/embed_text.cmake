# Turns a text file into a C++ source defining `std::string_view NAMESPACE::FUNCTION()`, so that
# the file ships inside the binary. Run by add_custom_command (CMakeLists.txt), so an edit of the
# input rebuilds it. Usage: cmake -DIN=file -DOUT=file.cpp -DHEADER=x.hpp -DNAMESPACE=ns
#                                 -DFUNCTION=fn -P embed_text.cmake
foreach(var IN ITEMS IN OUT HEADER NAMESPACE FUNCTION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_text.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${IN}" content)
get_filename_component(in_name "${IN}" NAME)
# The text goes into a raw string literal: it must not contain the literal's closing delimiter.
set(delim "baton_embed")
string(FIND "${content}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "embed_text.cmake: ${IN} contains ')${delim}\"'")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${in_name} by cmake/embed_text.cmake: do not edit.
#include \"${HEADER}\"

namespace ${NAMESPACE} {

std::string_view ${FUNCTION}() {
    static constexpr std::string_view text = R\"${delim}(${content})${delim}\";
    return text;
}

} // namespace ${NAMESPACE}
")
# Only a changed text touches the output (and recompiles it).
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
