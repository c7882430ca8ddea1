#include "comms.hpp"

#include <iostream>
#include <stdexcept>

#include "xeus/xinterpreter.hpp"

#include "iopub.hpp"
#include "json_bridge.hpp"
#include "signals.hpp"

namespace magpy_kernel {

namespace {

xeus::xcomm_manager& registry() { return xeus::get_interpreter().comm_manager(); }

// xeus keeps comm ids in a fixed-size string (xguid) and copies a longer one past its end.
constexpr std::size_t kMaxIdLength = 55;

// The message as ipykernel's comm handlers receive it. PRECONDITION: GIL held.
py::dict message_dict(const xeus::xmessage& request) {
    py::list buffers;
    for (const auto& b : request.buffers()) {
        // memoryviews, as ipykernel passes the frames it received
        buffers.append(py::memoryview(py::bytes(b.data(), b.size())));
    }
    py::dict msg;
    msg["header"] = from_json(request.header());
    msg["parent_header"] = from_json(request.parent_header());
    msg["metadata"] = from_json(request.metadata());
    msg["content"] = from_json(request.content());
    msg["buffers"] = buffers;
    msg["msg_type"] = request.header().value("msg_type", "");
    msg["msg_id"] = request.header().value("msg_id", "");
    return msg;
}

}  // namespace

Comms& Comms::instance() {
    static Comms comms;
    return comms;
}

bool Comms::is_comm_request(const std::string& msg_type) {
    return msg_type == "comm_open" || msg_type == "comm_msg" || msg_type == "comm_close" ||
           msg_type == "comm_info_request";
}

bool Comms::valid_id(const std::string& comm_id) {
    return !comm_id.empty() && comm_id.size() <= kMaxIdLength &&
           comm_id.find('\0') == std::string::npos;
}

bool Comms::prepare(const xeus::xmessage& request) {
    const std::string type = request.header().value("msg_type", "");
    if (type == "comm_info_request") return true;
    const nl::json& content = request.content();
    auto id = content.is_object() ? content.find("comm_id") : content.end();
    if (id == content.end() || !id->is_string() || !valid_id(id->get_ref<const std::string&>())) {
        std::cerr << "magpy-kernel: dropped a " << type << " whose comm_id is not a string of "
                  << "1 to " << kMaxIdLength << " bytes (the most xeus 2.4.1 holds)" << std::endl;
        return false;
    }
    if (type != "comm_open" || m_handler == nullptr) return true;
    auto name = content.find("target_name");
    if (name != content.end() && name->is_string()) add_target(name->get<std::string>());
    return true;
}

void Comms::set_handler(py::handle handler) {
    Py_XINCREF(handler.ptr());
    Py_XDECREF(m_handler);
    m_handler = handler.ptr();
}

void Comms::add_target(const std::string& name) {
    // Not registry().target(name) to ask: in xeus 2.4.1 it adds an empty target when missing.
    if (!m_targets.insert(name).second) return;
    registry().register_comm_target(name, [this](xeus::xcomm&& comm, xeus::xmessage request) {
        adopt(std::move(comm));
        forward("comm_open", request);
    });
}

void Comms::add_comm(const std::string& comm_id, const std::string& target_name) {
    sweep();
    if (m_comms.count(comm_id) != 0) return;
    if (!valid_id(comm_id)) {
        throw std::invalid_argument(
            "this kernel (xeus 2.4.1) holds comm ids of 1 to 55 bytes of UTF-8 with no NUL; "
            "this one has " + std::to_string(comm_id.size()) + " bytes ('" +
            comm_id.substr(0, 60) + (comm_id.size() > 60 ? "...')" : "')"));
    }
    add_target(target_name);
    // Built through a move: xcomm(target, id) leaves uninitialised the flag its destructor
    // reads (xeus 2.4.1); a moved-to xcomm has it set.
    xeus::xcomm made(registry().target(target_name), xeus::xguid(comm_id));
    adopt(std::move(made));
}

void Comms::remove_comm(const std::string& comm_id) {
    sweep();
    auto it = m_comms.find(comm_id);
    if (it == m_comms.end()) return;
    drop(std::move(it->second));
    m_comms.erase(it);
}

void Comms::adopt(xeus::xcomm&& comm) {
    sweep();
    const std::string id(comm.id().data(), comm.id().size());
    remove_comm(id);  // a frontend may reopen an id it used before
    auto owned = std::make_unique<xeus::xcomm>(std::move(comm));  // re-registers the new address
    install_handlers(*owned);
    m_comms[id] = std::move(owned);
}

void Comms::install_handlers(xeus::xcomm& comm) {
    const std::string id(comm.id().data(), comm.id().size());
    comm.on_message([this](xeus::xmessage request) { forward("comm_msg", request); });
    comm.on_close([this, id](xeus::xmessage request) {
        // xeus forgets the comm after this returns; the stand-in, whose handler is running
        // now, goes at the next call.
        m_closed.push_back(id);
        forward("comm_close", request);
    });
}

void Comms::drop(std::unique_ptr<xeus::xcomm> comm) {
    // The destructor unregisters the comm's id whoever holds it now; keep another holder.
    const xeus::xguid id = comm->id();
    auto& live = registry().comms();
    auto entry = live.find(id);
    xeus::xcomm* other = entry != live.end() && entry->second != comm.get() ? entry->second
                                                                             : nullptr;
    comm.reset();
    if (other != nullptr) {
        live[id] = other;
    } else {
        live.erase(id);
    }
}

void Comms::sweep() {
    for (const auto& id : m_closed) {
        auto it = m_comms.find(id);
        if (it == m_comms.end()) continue;
        drop(std::move(it->second));
        m_comms.erase(it);
    }
    m_closed.clear();
}

void Comms::forward(const char* msg_type, const xeus::xmessage& request) {
    if (m_handler == nullptr) return;
    IOPub& iopub = IOPub::instance();
    // What the handler prints or sends belongs to this request, as in ipykernel; output from
    // other threads afterwards goes back to the cell it came from.
    const nl::json previous = iopub.parent();
    iopub.set_parent(request.header());
    {
        SigintWindow interruptible;  // a long widget callback can be interrupted
        try {
            py::handle handler(m_handler);
            handler(msg_type, message_dict(request));
        } catch (py::error_already_set& e) {
            std::cerr << "magpy-kernel: the " << msg_type << " handler failed: " << e.what()
                      << std::endl;
        } catch (const std::exception& e) {
            std::cerr << "magpy-kernel: the " << msg_type << " handler failed: " << e.what()
                      << std::endl;
        }
    }
    iopub.set_parent(previous);
}

}  // namespace magpy_kernel
