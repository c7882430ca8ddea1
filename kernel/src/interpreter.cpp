#include "interpreter.hpp"

#include <iostream>

#include <pybind11/pybind11.h>

#include "iopub.hpp"
#include "json_bridge.hpp"
#include "server.hpp"
#include "signals.hpp"
#include "stdin.hpp"

namespace py = pybind11;

// Defined in the generated glue_source.cpp (kernel/CMakeLists.txt).
extern const char* const kMagpyKernelGlueSource;

namespace magpy_kernel {

namespace {

// The glue module, set by import_glue_module and kept for the process (never released: it
// lives as long as the interpreter, which is never finalized). Looked up once, not per
// request: an import through __import__ costs microseconds on every cell.
PyObject* g_glue = nullptr;

// PRECONDITION: GIL held, import_glue_module() done.
py::handle glue() { return py::handle(g_glue); }

// An error reply for a failure of the kernel's own machinery (not of the user's code, which
// IPython reports itself). Built by hand: xeus 2.4.1's create_error_reply swaps ename and evalue.
nl::json kernel_error_reply(const std::string& ename, const std::string& evalue) {
    return {{"status", "error"}, {"ename", ename}, {"evalue", evalue},
            {"traceback", nl::json::array({ename + ": " + evalue})}};
}

// PRECONDITION: GIL held.
std::pair<std::string, std::string> describe(py::error_already_set& e) {
    std::string ename = "Error";
    try {
        if (e.type()) ename = py::str(e.type().attr("__name__")).cast<std::string>();
    } catch (...) {
    }
    std::string evalue;
    try {
        evalue = e.value() ? utf8_of(py::str(e.value())) : std::string();
    } catch (...) {
        evalue = e.what();
    }
    return {ename, evalue};
}

}  // namespace

void import_glue_module() {
    py::module_ sys = py::module_::import("sys");
    py::module_ types = py::module_::import("types");
    const char* filename = "<magpy-kernel>/magpy_kernel.py";
    py::object module = types.attr("ModuleType")("magpy_kernel");
    module.attr("__file__") = filename;
    sys.attr("modules")["magpy_kernel"] = module;
    // So tracebacks through the glue show its lines.
    py::str source(kMagpyKernelGlueSource);
    py::module_::import("linecache").attr("cache")[py::str(filename)] = py::make_tuple(
        py::len(source), py::none(), source.attr("splitlines")(true), filename);
    py::object code = py::module_::import("builtins").attr("compile")(source, filename, "exec");
    py::module_::import("builtins").attr("exec")(code, module.attr("__dict__"));
    g_glue = module.release().ptr();
}

MagpyInterpreter::MagpyInterpreter() { xeus::register_interpreter(this); }

void MagpyInterpreter::configure_impl() {
    py::gil_scoped_acquire gil;
    import_glue_module();
    glue().attr("start")();
    m_kernel_info = to_json(glue().attr("kernel_info")());
}

nl::json MagpyInterpreter::execute_request_impl(int /*xeus_counter*/, const std::string& code,
                                                bool silent, bool store_history,
                                                nl::json user_expressions, bool allow_stdin) {
    // xeus counts store_history=false too; the server keeps the protocol's counter.
    const int count = KernelServer::current()->counter().current;
    IOPub& iopub = IOPub::instance();
    iopub.set_parent(parent_header());

    py::gil_scoped_acquire gil;
    nl::json reply;
    {
        StdinScope stdin_scope(allow_stdin);
        SigintWindow interruptible;
        try {
            py::object result = glue().attr("run_cell")(
                code, store_history, silent,
                user_expressions.is_object() ? from_json(user_expressions) : py::dict(), count);
            reply = to_json(result);
        } catch (py::error_already_set& e) {
            // An interrupt that lands in the kernel's glue rather than in the cell.
            auto [ename, evalue] = describe(e);
            reply = kernel_error_reply(ename, evalue);
            iopub.publish("error", {{"ename", ename}, {"evalue", evalue},
                                    {"traceback", reply["traceback"]}});
        } catch (const std::exception& e) {
            reply = kernel_error_reply("KernelError", e.what());
            iopub.publish("error", {{"ename", "KernelError"}, {"evalue", e.what()},
                                    {"traceback", reply["traceback"]}});
        }
    }
    {
        py::gil_scoped_release no_gil;  // output threads may need the GIL to finish writing
        iopub.drain_fds();
        iopub.flush();
    }
    if (!reply.is_object() || !reply.contains("status")) {
        reply = kernel_error_reply("KernelError", "the cell produced no reply");
    }
    if (reply.contains("_exit")) {
        // exit() or quit() in the cell: the kernel ends once this reply and the idle status
        // are out, after IPython's and atexit's clean-up, as ipykernel's does (its frontend
        // then restarts it)
        reply.erase("_exit");
        shutdown_request_impl();
        KernelServer::current()->stop();
    }
    return reply;
}

nl::json MagpyInterpreter::complete_request_impl(const std::string& code, int cursor_pos) {
    py::gil_scoped_acquire gil;
    try {
        return to_json(glue().attr("complete")(code, cursor_pos));
    } catch (py::error_already_set& e) {
        auto [ename, evalue] = describe(e);
        nl::json reply = kernel_error_reply(ename, evalue);
        reply.update({{"matches", nl::json::array()}, {"cursor_start", cursor_pos},
                      {"cursor_end", cursor_pos}, {"metadata", nl::json::object()}});
        return reply;
    }
}

nl::json MagpyInterpreter::inspect_request_impl(const std::string& code, int cursor_pos,
                                                int detail_level) {
    py::gil_scoped_acquire gil;
    try {
        return to_json(glue().attr("inspect")(code, cursor_pos, detail_level));
    } catch (py::error_already_set& e) {
        auto [ename, evalue] = describe(e);
        nl::json reply = kernel_error_reply(ename, evalue);
        reply.update({{"found", false}, {"data", nl::json::object()},
                      {"metadata", nl::json::object()}});
        return reply;
    }
}

nl::json MagpyInterpreter::is_complete_request_impl(const std::string& code) {
    py::gil_scoped_acquire gil;
    try {
        return to_json(glue().attr("is_complete")(code));
    } catch (py::error_already_set&) {
        return {{"status", "unknown"}};
    }
}

nl::json MagpyInterpreter::kernel_info_request_impl() { return m_kernel_info; }

void MagpyInterpreter::shutdown_request_impl() {
    py::gil_scoped_acquire gil;
    try {
        glue().attr("shutdown")();
    } catch (py::error_already_set& e) {
        std::cerr << "magpy-kernel: error during shutdown: " << e.what() << std::endl;
    }
    py::gil_scoped_release no_gil;
    IOPub::instance().drain_fds();
    IOPub::instance().flush();
}

}  // namespace magpy_kernel
