// The daemon binary's own copy of Boost.JSON and Boost.URL, compiled from their sources (Release
// builds only, see CMakeLists.txt): with the C++ runtime linked statically too, `baton serve` maps
// no libstdc++/libboost_* shared objects, which is most of its idle resident memory.
#include <boost/json/src.hpp>
#include <boost/url/src.hpp>
