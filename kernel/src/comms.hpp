// Jupyter comms (ipywidgets and anything else built on the `comm` package).
//
// [Note: comms]
// The comms themselves live in Python: magpy_kernel.py's CommManager (a subclass of the
// `comm` package's) holds the Comm objects and the targets, as ipykernel's does. xeus, though,
// routes the frontend's comm_open / comm_msg / comm_close and answers comm_info_request from
// its own C++ registry (xcomm_manager). So every Python comm and target gets a stand-in here,
// registered with xeus: a stand-in target forwards comm_open to Python, a stand-in comm
// forwards comm_msg and comm_close. Messages the kernel sends do not go through xeus's xcomm
// (which must run on the main thread): they are ordinary IOPub messages (iopub.hpp), so a comm
// may send from any thread and its messages keep their place among prints and displays.
//
// Locking: xeus's registry and the stand-ins are guarded by the GIL. Python code holds it
// when it opens or closes a comm, and the server takes it while xeus handles a comm request
// (server.cpp), so a comm opened in a background thread cannot race a comm_info_request.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "xeus/xcomm.hpp"

namespace magpy_kernel {

namespace py = pybind11;

class Comms {
public:
    static Comms& instance();

    // Whether xeus's handling of this shell request touches the comm registry (the server
    // holds the GIL around those).
    static bool is_comm_request(const std::string& msg_type);

    // Before xeus handles a comm request. Returns false for one xeus must not see: a comm id
    // that is not a string of 1 to 55 bytes (xeus 2.4.1 copies ids into a 55-byte buffer
    // without checking, and a longer one corrupts memory); it is dropped with a line in the
    // kernel's log. A comm_open to a target that nothing here has named yet gets a stand-in,
    // so Python's manager answers it (closes it, logging why), as in ipykernel.
    // PRECONDITION: GIL held.
    bool prepare(const xeus::xmessage& request);
    // Whether xeus can hold `comm_id`.
    static bool valid_id(const std::string& comm_id);

    // The Python callable that receives the frontend's comm messages as
    // handler(msg_type, msg) with msg a dict (header, parent_header, metadata, content,
    // buffers), as ipykernel's CommManager handlers take it. PRECONDITION: GIL held.
    void set_handler(py::handle handler);

    // A stand-in for a target name, so the frontend may open comms to it and comm_info can
    // name it. Stand-ins stay for the kernel's life: xeus's comms point at their target.
    // PRECONDITION: GIL held.
    void add_target(const std::string& name);
    // A stand-in for a comm the kernel opened (no-op if it has one). Throws
    // std::invalid_argument for an id xeus cannot hold. PRECONDITION: GIL held.
    void add_comm(const std::string& comm_id, const std::string& target_name);
    // Drops the comm's stand-in, if any. PRECONDITION: GIL held.
    void remove_comm(const std::string& comm_id);

private:
    Comms() = default;
    void adopt(xeus::xcomm&& comm);
    void install_handlers(xeus::xcomm& comm);
    void forward(const char* msg_type, const xeus::xmessage& request);
    void drop(std::unique_ptr<xeus::xcomm> comm);
    void sweep();

    std::set<std::string> m_targets;  // names with a stand-in in xeus's registry
    std::map<std::string, std::unique_ptr<xeus::xcomm>> m_comms;
    // Closed by the frontend while xeus was calling into them; dropped at the next call.
    std::vector<std::string> m_closed;
    PyObject* m_handler = nullptr;  // new reference, kept for the process
};

}  // namespace magpy_kernel
