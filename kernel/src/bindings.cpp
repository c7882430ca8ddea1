// `_magpy_kernel`: the embedded module through which the Python side (magpy_kernel.py) reaches
// the C++ side. Thin: conversions here, behaviour in iopub/stdin.
#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include "comms.hpp"
#include "iopub.hpp"
#include "json_bridge.hpp"
#include "stdin.hpp"

namespace py = pybind11;
using magpy_kernel::IOPub;
using magpy_kernel::Stream;

namespace {

Stream stream_of(const std::string& name) {
    if (name == "stdout") return Stream::kStdout;
    if (name == "stderr") return Stream::kStderr;
    throw std::invalid_argument("unknown stream '" + name + "' (expected stdout or stderr)");
}

// A bundle's JSON; display data must be an object.
magpy_kernel::nl::json object_of(py::handle obj) {
    auto j = magpy_kernel::to_json(obj);
    return j.is_object() ? j : magpy_kernel::nl::json::object();
}

// The binary parts of a message: any contiguous bytes-like objects, copied.
xeus::buffer_sequence buffers_of(py::handle seq) {
    xeus::buffer_sequence out;
    if (seq.is_none()) return out;
    for (py::handle item : seq) {
        Py_buffer view;
        if (PyObject_GetBuffer(item.ptr(), &view, PyBUF_SIMPLE) != 0) {
            PyErr_Clear();
            throw py::type_error(std::string("a comm message buffer must be a contiguous "
                                             "bytes-like object (bytes, bytearray, memoryview), "
                                             "not ") + Py_TYPE(item.ptr())->tp_name);
        }
        const char* data = static_cast<const char*>(view.buf);
        out.emplace_back(data, data + view.len);
        PyBuffer_Release(&view);
    }
    return out;
}

}  // namespace

PYBIND11_EMBEDDED_MODULE(_magpy_kernel, m) {
    m.doc() = "C++ side of the magpy kernel (streams, displays, stdin).";

    m.def("write_stream", [](const std::string& name, py::handle text) {
        if (!PyUnicode_Check(text.ptr())) throw py::type_error("write_stream needs a str");
        IOPub::instance().write(stream_of(name), magpy_kernel::utf8_of(text));
    });
    m.def("write_stream_bytes", [](const std::string& name, py::bytes data) {
        char* buf = nullptr;
        Py_ssize_t len = 0;
        if (PyBytes_AsStringAndSize(data.ptr(), &buf, &len) != 0) throw py::error_already_set();
        IOPub::instance().write(stream_of(name), std::string_view(buf, static_cast<std::size_t>(len)));
    });
    m.def("flush_streams", [] {
        py::gil_scoped_release no_gil;
        IOPub::instance().flush();
    });
    m.def("publish_display", [](py::handle data, py::handle metadata, py::handle transient,
                                bool update) {
        magpy_kernel::nl::json content = {{"data", object_of(data)},
                                          {"metadata", object_of(metadata)},
                                          {"transient", object_of(transient)}};
        py::gil_scoped_release no_gil;
        IOPub::instance().publish(update ? "update_display_data" : "display_data",
                                  std::move(content));
    });
    m.def("publish_clear_output", [](bool wait) {
        py::gil_scoped_release no_gil;
        IOPub::instance().publish("clear_output", {{"wait", wait}});
    });
    m.def("publish_execute_result", [](int count, py::handle data, py::handle metadata) {
        magpy_kernel::nl::json content = {{"execution_count", count},
                                          {"data", object_of(data)},
                                          {"metadata", object_of(metadata)}};
        py::gil_scoped_release no_gil;
        IOPub::instance().publish("execute_result", std::move(content));
    });
    m.def("publish_error", [](py::handle ename, py::handle evalue, py::handle traceback) {
        magpy_kernel::nl::json content = {{"ename", magpy_kernel::to_json(ename)},
                                          {"evalue", magpy_kernel::to_json(evalue)},
                                          {"traceback", magpy_kernel::to_json(traceback)}};
        py::gil_scoped_release no_gil;
        IOPub::instance().publish("error", std::move(content));
    });
    // comms (comms.hpp): what the kernel sends is plain IOPub; the registry mirrors Python's
    m.def("publish_comm", [](const std::string& msg_type, py::handle content,
                             py::handle metadata, py::handle buffers) {
        magpy_kernel::nl::json c = object_of(content);
        magpy_kernel::nl::json md = object_of(metadata);
        xeus::buffer_sequence bufs = buffers_of(buffers);
        py::gil_scoped_release no_gil;
        IOPub::instance().publish(msg_type, std::move(c), std::move(md), std::move(bufs));
    });
    m.def("comm_set_handler", [](py::handle handler) {
        magpy_kernel::Comms::instance().set_handler(handler);
    });
    m.def("comm_add_target", [](const std::string& name) {
        magpy_kernel::Comms::instance().add_target(name);
    });
    m.def("comm_add", [](const std::string& comm_id, const std::string& target_name) {
        try {
            magpy_kernel::Comms::instance().add_comm(comm_id, target_name);
        } catch (const std::invalid_argument& e) {
            throw py::value_error(e.what());
        }
    });
    m.def("comm_remove", [](const std::string& comm_id) {
        magpy_kernel::Comms::instance().remove_comm(comm_id);
    });
    m.def("current_parent", [] {  // the header of the request being answered
        return magpy_kernel::from_json(IOPub::instance().parent());
    });
    m.def("log_fd", [] { return IOPub::log_fd(); });
    m.def("stdin_allowed", [] { return magpy_kernel::StdinScope::allowed(); });
    m.def("request_input", [](const std::string& prompt, bool password) {
        return magpy_kernel::request_input(prompt, password);
    });
    m.def("fds_captured", [] { return IOPub::instance().fds_captured(); });
}
