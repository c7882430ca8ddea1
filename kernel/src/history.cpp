#include "history.hpp"

#include <pybind11/pybind11.h>

#include "json_bridge.hpp"

namespace py = pybind11;

namespace magpy_kernel {

namespace {

// PRECONDITION: none (takes the GIL). Never throws: a failure becomes an error reply.
nl::json query(const char* kind, int session, int start, int stop, int n,
               const std::string& pattern, bool raw, bool output, bool unique) {
    py::gil_scoped_acquire gil;
    try {
        py::object glue = py::module_::import("magpy_kernel");
        py::object entries = glue.attr("history")(kind, session, start, stop, n, pattern, raw,
                                                  output, unique);
        return {{"status", "ok"}, {"history", to_json(entries)}};
    } catch (py::error_already_set& e) {
        const std::string ename = e.type() ? py::str(e.type().attr("__name__")).cast<std::string>()
                                           : std::string("Error");
        return {{"status", "error"}, {"ename", ename}, {"evalue", e.what()},
                {"traceback", nl::json::array()}, {"history", nl::json::array()}};
    }
}

}  // namespace

nl::json IPythonHistory::get_tail_impl(int n, bool raw, bool output) const {
    return query("tail", 0, 0, 0, n, "", raw, output, false);
}

nl::json IPythonHistory::get_range_impl(int session, int start, int stop, bool raw,
                                        bool output) const {
    return query("range", session, start, stop, 0, "", raw, output, false);
}

nl::json IPythonHistory::search_impl(const std::string& pattern, bool raw, bool output, int n,
                                     bool unique) const {
    return query("search", 0, 0, 0, n, pattern, raw, output, unique);
}

}  // namespace magpy_kernel
