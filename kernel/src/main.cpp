// magpy-kernel: a Jupyter kernel (xeus 2.4.1) running an IPython shell in an embedded CPython.
// Jupyter starts it as `magpy-kernel -f CONNECTION_FILE` (share/jupyter/kernels/magpy).
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "xeus/xkernel.hpp"
#include "xeus/xkernel_configuration.hpp"

#include "history.hpp"
#include "interpreter.hpp"
#include "iopub.hpp"
#include "server.hpp"
#include "signals.hpp"

#ifndef MAGPY_KERNEL_PYTHON
#define MAGPY_KERNEL_PYTHON "/usr/bin/python3"
#endif
#ifndef MAGPY_KERNEL_VERSION
#define MAGPY_KERNEL_VERSION "0.1.0"
#endif

namespace py = pybind11;
using namespace magpy_kernel;

namespace {

const char* kUsage =
    "usage: magpy-kernel -f CONNECTION_FILE\n"
    "\n"
    "A Jupyter kernel for Python with the %%magpy cell magic. Jupyter starts it for you:\n"
    "install the kernelspec with scripts/install-kernel.sh, then pick \"Python 3 (magpy)\"\n"
    "(or run `jupyter console --kernel magpy`).\n";

[[noreturn]] void on_terminate() {
    // The last words go to the terminal, not to a captured fd nobody reads any more.
    std::string what = "unknown";
    if (auto e = std::current_exception()) {
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            what = ex.what();
        } catch (...) {
        }
    }
    const std::string msg = "magpy-kernel: fatal: uncaught exception: " + what + "\n";
    (void)!::write(IOPub::log_fd(), msg.data(), msg.size());
    std::abort();
}

// Debian's interpreter, explicitly: PATH may lead to another python3 without torch, and an
// embedded interpreter guesses sys.executable from PATH (/work/shared/notes/kernel.md §2.7).
py::scoped_interpreter* start_python() {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    PyConfig_SetBytesString(&config, &config.executable, MAGPY_KERNEL_PYTHON);
    PyConfig_SetBytesString(&config, &config.program_name, MAGPY_KERNEL_PYTHON);
    config.parse_argv = 0;
    config.install_signal_handlers = 1;
    static const char* argv[] = {""};
    // Never deleted: the kernel leaves through _Exit, without finalizing Python.
    return new py::scoped_interpreter(&config, 1, argv, /*add_program_dir_to_path=*/false);
}

// Like ipykernel's parent poller: when the process that started us (Jupyter) dies, a kernel
// left behind would hold its ports and CPU forever, so it leaves too.
void exit_with_parent() {
    const pid_t parent = ::getppid();
    std::thread([parent] {
        for (;;) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
            if (::getppid() != parent) std::_Exit(1);
        }
    }).detach();
}

}  // namespace

int main(int argc, char* argv[]) {
    std::string connection_file;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--version") {
            std::cout << "magpy-kernel " << MAGPY_KERNEL_VERSION << " (xeus "
                      << XEUS_VERSION_MAJOR << "." << XEUS_VERSION_MINOR << "."
                      << XEUS_VERSION_PATCH << ", Python " << MAGPY_KERNEL_PYTHON << ")\n";
            return 0;
        }
        if (arg == "-h" || arg == "--help") {
            std::cout << kUsage;
            return 0;
        }
        if (arg == "-f" && i + 1 < argc) {
            connection_file = argv[++i];
        } else if (arg.rfind("--f=", 0) == 0) {
            connection_file = arg.substr(4);
        } else {
            std::cerr << "magpy-kernel: unexpected argument '" << arg << "'\n\n" << kUsage;
            return 2;
        }
    }
    if (connection_file.empty()) {
        std::cerr << "magpy-kernel: no connection file given\n\n" << kUsage;
        return 2;
    }
    if (!std::ifstream(connection_file)) {
        std::cerr << "magpy-kernel: cannot read the connection file '" << connection_file
                  << "' (" << std::strerror(errno) << ")\n";
        return 2;
    }
    xeus::xconfiguration config;
    try {
        config = xeus::load_configuration(connection_file);
    } catch (const std::exception& e) {
        std::cerr << "magpy-kernel: the connection file '" << connection_file
                  << "' is not valid: " << e.what() << "\n";
        return 2;
    }
    std::set_terminate(on_terminate);

    start_python();
    // Before any thread exists, so that every thread inherits it (signals.hpp).
    block_sigint();
    IOPub::instance().start_flusher();
    exit_with_parent();

    std::unique_ptr<xeus::xlogger> logger;
    if (std::getenv("XEUS_LOG") != nullptr) {
        logger = xeus::make_console_logger(
            xeus::xlogger::msg_type,
            xeus::make_file_logger(xeus::xlogger::content, "magpy-kernel.log"));
    }
    auto context = xeus::make_context<zmq::context_t>();
    // The constructor runs MagpyInterpreter::configure_impl (the IPython shell, %load_ext magpy);
    // its output still goes to the terminal.
    xeus::xkernel kernel(config, xeus::get_user_name(), std::move(context),
                         std::make_unique<MagpyInterpreter>(), &KernelServer::build,
                         std::make_unique<IPythonHistory>(), std::move(logger),
                         xeus::make_null_debugger, nl::json::object(),
                         nl::json::error_handler_t::replace);

    // From here on, output belongs to cells.
    const char* capture = std::getenv("MAGPY_KERNEL_CAPTURE_FDS");
    const bool captured =
        !(capture != nullptr && std::strcmp(capture, "0") == 0) && IOPub::instance().capture_fds();
    {
        py::gil_scoped_acquire gil;
        py::module_::import("magpy_kernel").attr("install_streams")(captured);
        // for %connect_info, as ipykernel's
        char* full = ::realpath(connection_file.c_str(), nullptr);
        py::module_::import("magpy_kernel").attr("connection_file") =
            full != nullptr ? std::string(full) : connection_file;
        std::free(full);
    }
    // [Note: asyncio between cells] in magpy_kernel.py
    KernelServer::current()->set_idle_work([](bool io_ready) {
        KernelServer::IdleWait wait;
        py::gil_scoped_acquire gil;
        try {
            auto r = py::module_::import("magpy_kernel").attr("run_asyncio")(io_ready)
                         .cast<std::pair<long, int>>();
            wait.timeout_ms = r.first;
            wait.fd = r.second;
        } catch (const std::exception& e) {
            std::cerr << "magpy-kernel: the asyncio loop failed between cells: " << e.what()
                      << std::endl;
        }
        return wait;
    });
    // Python threads run while the kernel waits; each request takes the GIL back.
    PyEval_SaveThread();
    kernel.start();  // never returns (KernelServer::start_impl exits the process)
    return 0;
}
