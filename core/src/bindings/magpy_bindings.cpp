// The _magpy extension module: the only file that uses pybind11. Nothing here is on the
// per-call path; CompiledFunction calls go straight to the C type in api/.
#include "hook/frame_hook.h"
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "api/compiled_function.h"
#include "backends/backend.h"
#include "cache/code_cache.h"
#include "profile/profiler.h"
#include "python/torch_api.h"
#include "report/report.h"

namespace py11 = pybind11;

#include <execinfo.h>
#include <csignal>
#include <cstdlib>
#include <unistd.h>

namespace {
// MAGPY_NATIVE_BACKTRACE=1: a crash prints the native stack (addresses in the module as
// "_magpy...so(+0xOFFSET)", for addr2line) before Python's faulthandler reports the Python one.
// A debugging aid for machines without gdb (the device machine of tests/gpu).
void native_backtrace(int sig) {
    void* frames[64];
    int n = backtrace(frames, 64);
    const char head[] = "magpy: native backtrace\n";
    (void)!write(2, head, sizeof head - 1);
    backtrace_symbols_fd(frames, n, 2);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}
}  // namespace

PYBIND11_MODULE(_magpy, m) {
    if (const char* e = std::getenv("MAGPY_NATIVE_BACKTRACE"); e && *e && *e != '0') {
        std::signal(SIGSEGV, native_backtrace);
        std::signal(SIGABRT, native_backtrace);
    }
    m.doc() = "magpy engine core (C++). Use the `magpy` package, not this module.";

    if (!magpy::init_torch_api()) throw py11::error_already_set();
    PyTypeObject* cf_type = magpy::compiled_function_type();
    if (!cf_type) throw py11::error_already_set();
    m.add_object("CompiledFunction", py11::handle(reinterpret_cast<PyObject*>(cf_type)));

    static py11::exception<std::runtime_error> graph_break(m, "GraphBreakError",
                                                           PyExc_RuntimeError);
    magpy::set_graph_break_error(graph_break.ptr());

    m.def(
        "compile",
        [](py11::object target, std::string backend, bool fullgraph, py11::object dynamic,
           size_t cache_limit) {
            magpy::CompileOptions o;
            o.backend = std::move(backend);
            o.fullgraph = fullgraph;
            o.dynamic = dynamic.is_none() ? -1 : (dynamic.cast<bool>() ? 1 : 0);
            if (cache_limit == 0)
                throw py11::value_error("magpy.compile(): cache_limit must be at least 1");
            o.cache_limit = cache_limit;
            PyObject* cf = magpy::make_compiled_function(target.ptr(), o);
            if (!cf) throw py11::error_already_set();
            return py11::reinterpret_steal<py11::object>(cf);
        },
        py11::arg("target"), py11::arg("backend") = "eager", py11::arg("fullgraph") = false,
        py11::arg("dynamic") = py11::none(), py11::arg("cache_limit") = 8);

    m.def("report_json", [](py11::object cf) {
        magpy::CompiledState* st = magpy::compiled_state(cf.ptr());
        if (!st)
            throw py11::type_error("magpy.explain() expects the result of magpy.compile(), got " +
                                   std::string(Py_TYPE(cf.ptr())->tp_name));
        return magpy::make_report(*st).dump();
    });

    m.def("reset", [] { magpy::clear_all_caches(); });
    m.def("_fx_signature", [](py11::object tensors) {
        PyObject* r = magpy::fx_signature(tensors.ptr(), true);
        if (!r) throw py11::error_already_set();
        return py11::reinterpret_steal<py11::object>(r);
    });
    m.def("_fx_pins_signature", [](py11::object pins, py11::object expected) {
        PyObject* r = magpy::fx_pins_signature(pins.ptr(),
                                               expected.is_none() ? nullptr : expected.ptr());
        if (!r) throw py11::error_already_set();
        return py11::reinterpret_steal<py11::object>(r);
    }, py11::arg("pins"), py11::arg("expected") = py11::none());
    // For live views (magpy._ipython): hook(event, info) as the engine captures and compiles.
    m.def("_set_progress_hook", [](py11::object hook) {
        if (!hook.is_none() && !PyCallable_Check(hook.ptr()))
            throw py11::type_error("magpy._set_progress_hook() expects a callable or None");
        magpy::set_progress_hook(hook.is_none() ? nullptr : hook.ptr());
    });
    m.def("backends", [] { return magpy::backend_names(); });
    m.attr("REPORT_SCHEMA_VERSION") = magpy::kReportSchemaVersion;

    // Kernel profiler (profile/profiler.h): CUPTI where built in and a GPU is present; elsewhere
    // it says why in the status and the rest are no-ops. The GIL is released around calls that
    // may wait for the device.
    m.def("profiler_status", [] {
        magpy::Profiler& p = magpy::profiler();
        py11::dict d;
        d["available"] = p.available();
        d["status"] = p.status();
        d["backend"] = p.name();
        d["running"] = p.running();
        d["dropped"] = p.dropped();
        d["error"] = p.error();
        return d;
    });
    m.def("profiler_start", [] {
        magpy::Profiler& p = magpy::profiler();
        {
            py11::gil_scoped_release release;
            p.start();
        }
        return p.running();
    });
    m.def("profiler_stop", [] {
        py11::gil_scoped_release release;
        magpy::profiler().stop();
    });
    m.def("profiler_flush", [] {
        std::vector<magpy::KernelRecord> records;
        {
            py11::gil_scoped_release release;
            records = magpy::profiler().flush();
        }
        py11::list out;
        for (const magpy::KernelRecord& r : records) {
            py11::dict d;
            d["name"] = r.name;
            d["kind"] = magpy::activity_kind_name(r.kind);
            d["start_ns"] = r.start_ns;
            d["end_ns"] = r.end_ns;
            d["graph_id"] = r.graph_id;
            d["correlation_id"] = r.correlation_id;
            d["device"] = r.device;
            d["stream"] = r.stream;
            d["bytes"] = r.bytes;
            out.append(std::move(d));
        }
        return out;
    });
}
