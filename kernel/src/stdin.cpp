#include "stdin.hpp"

#include <atomic>
#include <stdexcept>
#include <thread>

#include <pybind11/pybind11.h>

#include "xeus/xinterpreter.hpp"

#include "iopub.hpp"
#include "server.hpp"

namespace py = pybind11;

namespace magpy_kernel {

namespace {
std::atomic<bool> g_allowed{false};  // read by any thread
std::atomic<bool> g_in_cell{false};
std::thread::id g_cell_thread;
}  // namespace

StdinScope::StdinScope(bool allowed) {
    g_allowed = allowed;
    g_in_cell = true;
    g_cell_thread = std::this_thread::get_id();
}

StdinScope::~StdinScope() {
    g_allowed = false;
    g_in_cell = false;
}

bool StdinScope::allowed() { return g_allowed; }

std::string request_input(const std::string& prompt, bool password) {
    // The stdin socket belongs to the main thread, which waits in the request.
    if (!g_in_cell || std::this_thread::get_id() != g_cell_thread) {
        throw std::runtime_error(
            "input() can only ask the frontend from the cell's own (main) thread while the "
            "cell runs; read the value in the cell and pass it to the thread.");
    }
    KernelServer* server = KernelServer::current();
    if (server == nullptr) throw std::runtime_error("the kernel server is not running");

    // The prompt text follows the cell's earlier output.
    IOPub::instance().flush();

    // Kept by the server while waiting; runs with no GIL, so take it to look at signals.
    PyObject *err_type = nullptr, *err_value = nullptr, *err_tb = nullptr;
    server->set_stdin_interrupt_check([&]() {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() == 0) return false;
        PyErr_Fetch(&err_type, &err_value, &err_tb);  // kept for the re-raise below
        return true;
    });

    auto& interp = xeus::get_interpreter();
    std::string value;
    bool interrupted = false;
    interp.register_input_handler([&value](const std::string& v) { value = v; });
    {
        py::gil_scoped_release no_gil;
        try {
            interp.input_request(prompt, password);
        } catch (const KernelServer::StdinInterrupted&) {
            interrupted = true;
        }
    }
    interp.register_input_handler([](const std::string&) {});  // never a dangling capture
    server->set_stdin_interrupt_check(nullptr);
    if (interrupted) {
        if (err_type == nullptr) {
            PyErr_SetNone(PyExc_KeyboardInterrupt);
        } else {
            PyErr_Restore(err_type, err_value, err_tb);  // steals the references
        }
        throw py::error_already_set();
    }
    return value;
}

}  // namespace magpy_kernel
