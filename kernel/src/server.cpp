#include "server.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "xeus/xguid.hpp"
#include "xeus/xkernel.hpp"
#include "xeus/xmiddleware.hpp"
#include "xeus/xzmq_serializer.hpp"

#include <pybind11/pybind11.h>

#include "comms.hpp"
#include "iopub.hpp"

namespace magpy_kernel {

namespace {

KernelServer* g_server = nullptr;

bool is_eintr(const zmq::error_t& e) { return e.num() == EINTR; }

std::string msg_type_of(const nl::json& header) { return header.value("msg_type", ""); }

// xeus 2.4.1 writes the microseconds of a header's date without leading zeros
// ("12:00:54.96634Z" for 54.096634 s), which clients read as another time. The digits are
// the whole microsecond count, so padding them to six restores the time it meant.
// The number of zeros the date's microseconds lack (0: nothing to fix).
size_t missing_zeros(const nl::json& header) {
    auto date = header.find("date");
    if (date == header.end() || !date->is_string()) return 0;
    const std::string& d = date->get_ref<const std::string&>();
    const size_t dot = d.rfind('.');
    if (dot == std::string::npos) return 0;
    const size_t end = d.find_first_not_of("0123456789", dot + 1);
    const size_t digits = (end == std::string::npos ? d.size() : end) - dot - 1;
    return end == std::string::npos || digits == 0 || digits >= 6 ? 0 : 6 - digits;
}

nl::json fixed_header(const nl::json& header) {
    const size_t zeros = missing_zeros(header);
    if (zeros == 0) return header;
    nl::json fixed = header;
    std::string d = header["date"].get<std::string>();
    fixed["date"] = d.insert(d.rfind('.') + 1, zeros, '0');
    return fixed;
}

// [Note: IOPub without a publisher thread]
// xserver_zmq publishes through a thread: each IOPub message goes over an inproc socket to a
// publisher thread, which forwards it to the IOPub socket. That is one more thread to wake per
// message (three per request: busy, execute_input, idle), and on a loaded two-core machine the
// wake-up shows in every round trip. Here the IOPub socket is ours: bound on the port the
// connection file names and written directly by whichever thread publishes, under a mutex
// (a ZeroMQ socket may change threads with a full fence between uses). xserver_zmq still builds
// its publisher, so it is handed a copy of the configuration whose IOPub port is left for it
// to pick; that publisher's thread is never started, and nothing is sent to it.
xeus::xconfiguration without_iopub_port(xeus::xconfiguration config) {
    config.m_iopub_port.clear();  // xeus binds its (unused) publisher to a free port
    return config;
}

}  // namespace

KernelServer::KernelServer(zmq::context_t& context, const xeus::xconfiguration& config,
                           nl::json::error_handler_t eh)
    : xserver_zmq(context, without_iopub_port(config), eh),
      m_iopub(context, zmq::socket_type::pub),
      m_control_main(context, zmq::socket_type::pair),
      m_control_side(context, zmq::socket_type::pair),
      m_control_auth(xeus::make_xauthentication(config.m_signature_scheme, config.m_key)) {
    const std::string pipe = "inproc://magpy-control-" + std::to_string(::getpid());
    m_control_side.bind(pipe);
    m_control_main.connect(pipe);
    // No send limit: at ZeroMQ's default of 1000 queued messages a PUB socket drops what a
    // slower subscriber has not taken yet, silently, the final `idle` included (a review probe:
    // 20,000 alternating stdout/stderr lines kept the frontend busy forever). Output waits in
    // memory until the frontend reads it, as ipykernel's does.
    m_iopub.set(zmq::sockopt::sndhwm, 0);
    xeus::init_socket(m_iopub, config.m_transport, config.m_ip, config.m_iopub_port);
    g_server = this;
}

void KernelServer::update_config_impl(xeus::xconfiguration& config) const {
    xserver_zmq::update_config_impl(config);
    config.m_iopub_port = xeus::get_socket_port(m_iopub);
}

KernelServer* KernelServer::current() { return g_server; }

std::unique_ptr<xeus::xserver> KernelServer::build(xeus::xcontext& context,
                                                   const xeus::xconfiguration& config,
                                                   nl::json::error_handler_t eh) {
    return std::make_unique<KernelServer>(context.get_wrapped_context<zmq::context_t>(), config,
                                          eh);
}

void KernelServer::start_impl(xeus::xpub_message message) {
    // The "starting" status carries the session id that our own messages must share.
    const std::string session = message.header().value("session", "");
    std::string prefix = message.topic();
    const auto dot = prefix.rfind('.');
    prefix = dot == std::string::npos ? std::string() : prefix.substr(0, dot + 1);

    start_heartbeat_thread();
    m_session = session;
    m_topic_prefix = prefix;
    m_control_thread = std::thread([this] { control_loop(); });
    m_request_stop = false;
    publish(std::move(message), xeus::channel::SHELL);
    IOPub::instance().attach(
        [this](xeus::xpub_message msg) { publish(std::move(msg), xeus::channel::SHELL); },
        xeus::get_user_name(), session, prefix);

    while (!m_request_stop) {
        IdleWait wait;
        if (m_idle_work && m_deferred.empty()) wait = m_idle_work(m_idle_fd_ready);
        poll_once(wait.timeout_ms, wait.fd);
    }

    IOPub::instance().detach();
    stop_control_thread();
    {  // the heartbeat thread answers once and ends (xserver_zmq::stop_channels would also
       // wait for the publisher thread, which never ran)
        zmq::message_t stop("stop", 4), answer;
        m_heartbeat_controller.send(stop, zmq::send_flags::none);
        (void)m_heartbeat_controller.recv(answer);
    }
    // Give ZeroMQ's I/O thread a moment to deliver the shutdown reply, then leave without
    // running static destructors (libtorch's may not survive a live, unfinalized Python).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fflush(nullptr);
    std::_Exit(0);
}

// xserver_zmq::poll lets zmq::poll's EINTR escape and the kernel dies (xeus#272); here a
// signal only ends one wait.
void KernelServer::poll_once(long timeout_ms, int extra_fd) {
    m_idle_fd_ready = false;
    if (!m_deferred.empty() && !m_request_stop) {
        // requests kept back while execute requests were aborted, in the order they came
        xeus::xmessage msg = std::move(m_deferred.front());
        m_deferred.pop_front();
        return guarded([&] { handle_shell(std::move(msg)); });
    }
    zmq::pollitem_t items[] = {{m_control_main.handle(), 0, ZMQ_POLLIN, 0},
                               {m_shell.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, extra_fd, ZMQ_POLLIN, 0}};
    try {
        zmq::poll(&items[0], extra_fd >= 0 ? 3 : 2, std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
        if (is_eintr(e)) return;
        std::cerr << "magpy-kernel: poll failed: " << e.what() << std::endl;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
    }
    m_idle_fd_ready = extra_fd >= 0 && (items[2].revents & ZMQ_POLLIN);
    zmq::socket_t* sockets[] = {&m_control_main, &m_shell};
    for (int i = 0; i < 2; ++i) {
        if (!(items[i].revents & ZMQ_POLLIN) || (i == 1 && m_request_stop)) continue;
        guarded([&] {
            zmq::multipart_t wire;
            if (!wire.recv(*sockets[i], ZMQ_DONTWAIT)) return;
            xeus::xmessage msg = xeus::xzmq_serializer::deserialize(wire, *p_auth);
            if (i == 0) {
                notify_control_listener(std::move(msg));
            } else {
                handle_shell(std::move(msg));
            }
        });
    }
}

template <class F>
void KernelServer::guarded(F&& receive_and_handle) {
    try {
        receive_and_handle();
    } catch (const zmq::error_t& e) {
        if (!is_eintr(e)) std::cerr << "magpy-kernel: receive failed: " << e.what() << std::endl;
    } catch (const std::exception& e) {
        // A malformed or wrongly signed message: drop it, keep serving.
        std::cerr << "magpy-kernel: dropped a message that could not be read: " << e.what()
                  << std::endl;
    }
}

// Requests xeus 2.4.1 mishandles, put in the form it handles (review probes):
// - fields a client may send as null where xeus reads a number (`stop: null` is ipykernel's
//   own default for history ranges): xeus threw on them and the request got no reply. They are
//   dropped, so the defaults apply; a null cursor is the end of the code, as the protocol says;
// - a history request of a kind xeus does not know got a reply with no `history`: it is asked
//   as an empty range, which gives `history: []` as ipykernel does.
static xeus::xmessage normalized_request(xeus::xmessage msg) {
    const nl::json& c = msg.content();
    if (!c.is_object()) return msg;
    const std::string type = msg_type_of(msg.header());
    bool nulls = false;
    for (auto it = c.begin(); it != c.end() && !nulls; ++it) nulls = it.value().is_null();
    const nl::json kind = c.value("hist_access_type", nl::json());
    bool unknown_history = type == "history_request" &&
                           !(kind == "tail" || kind == "range" || kind == "search");
    if (!nulls && !unknown_history) return msg;
    nl::json content = nl::json::object();
    for (auto it = c.begin(); it != c.end(); ++it)
        if (!it.value().is_null()) content[it.key()] = it.value();
    if ((type == "complete_request" || type == "inspect_request") &&
        !content.contains("cursor_pos") && content.value("code", nl::json()).is_string())
        content["cursor_pos"] = content["code"].get<std::string>().size();
    if (unknown_history) {
        content["hist_access_type"] = "range";
        content["session"] = 0;
        content["start"] = 1;  // lines [1, 1) of this session: none
        content["stop"] = 1;
    }
    return xeus::xmessage(msg.identities(), msg.header(), msg.parent_header(), msg.metadata(),
                          std::move(content), xeus::buffer_sequence(msg.buffers()));
}

void KernelServer::handle_shell(xeus::xmessage msg) {
    msg = normalized_request(std::move(msg));
    try {
        note_request(msg);
    } catch (const std::exception&) {
        // a malformed request is still xeus's to answer
    }
    if (Comms::is_comm_request(msg_type_of(msg.header()))) {
        // xeus's comm registry is guarded by the GIL ([Note: comms])
        pybind11::gil_scoped_acquire gil;
        if (Comms::instance().prepare(msg)) notify_shell_listener(std::move(msg));
    } else {
        notify_shell_listener(std::move(msg));
    }
}

// stop_on_error: after a failed execute request, xeus 2.4.1 answers every shell message already
// queued with an error reply, comm messages and completions included, and sleeps between them.
// As in ipykernel, only execute requests are aborted; the others are kept and handled next.
void KernelServer::abort_queue_impl(const listener& abort, long) {
    for (;;) {
        zmq::multipart_t wire;
        try {
            if (!wire.recv(m_shell, ZMQ_DONTWAIT)) return;
        } catch (const zmq::error_t& e) {
            if (is_eintr(e)) continue;
            std::cerr << "magpy-kernel: receive failed: " << e.what() << std::endl;
            return;
        }
        guarded([&] {
            xeus::xmessage msg = xeus::xzmq_serializer::deserialize(wire, *p_auth);
            if (msg_type_of(msg.header()) == "execute_request") {
                abort(std::move(msg));
            } else {
                m_deferred.push_back(std::move(msg));
            }
        });
    }
}

void KernelServer::note_request(const xeus::xmessage& msg) {
    if (msg_type_of(msg.header()) != "execute_request") return;
    const nl::json& c = msg.content();
    const bool silent = c.is_object() && c.value("silent", false);
    const bool store = c.is_object() && c.value("store_history", true);
    // IPython stores no history for a blank cell; counting it would shift In[n] from n.
    const std::string code = c.is_object() ? c.value("code", "") : std::string();
    const bool blank = code.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
    if (store && !silent && !blank) ++m_counter.current;
}

void KernelServer::publish_impl(xeus::xpub_message message, xeus::channel) {
    // xeus 2.4.1 answers an interrupt_request by also publishing a message of type "interrupt",
    // which the protocol does not have (a review probe): not sent
    if (msg_type_of(message.header()) == "interrupt") return;
    // xeus numbers execute_input with its own counter, which also counts store_history=false;
    // use the protocol's. Messages are rebuilt only when something changes (most are not).
    const bool input = msg_type_of(message.header()) == "execute_input";
    if (input || missing_zeros(message.header()) > 0) {
        nl::json content = message.content();
        if (input) content["execution_count"] = m_counter.current;
        message = xeus::xpub_message(message.topic(), fixed_header(message.header()),
                                     message.parent_header(), message.metadata(),
                                     std::move(content), xeus::buffer_sequence(message.buffers()));
    }
    zmq::multipart_t wire =
        xeus::xzmq_serializer::serialize_iopub(std::move(message), *p_auth, m_error_handler);
    std::lock_guard<std::mutex> lock(m_socket);
    wire.send(m_iopub);
}

xeus::xmessage KernelServer::fix_reply(xeus::xmessage message) {
    nl::json content = message.content();
    if (!content.is_object()) content = nl::json::object();
    const std::string type = msg_type_of(message.header());
    if (type == "execute_reply") content["execution_count"] = m_counter.current;
    if (!content.contains("status")) {
        content["status"] = "ok";  // xeus 2.4.1's shutdown and interrupt replies have none
    } else if (content["status"] == "error" && !content.contains("ename")) {
        // stop_on_error: xeus answers queued requests with a bare error; the protocol's
        // word for them is "aborted".
        content["status"] = "aborted";
    }
    if (type == "kernel_info_reply" && content.value("status", "") == "ok") {
        std::lock_guard<std::mutex> lock(m_info_lock);  // for the control thread
        m_kernel_info = content;
    }
    return xeus::xmessage(message.identities(), fixed_header(message.header()),
                          message.parent_header(), message.metadata(), std::move(content),
                          xeus::buffer_sequence(message.buffers()));
}

void KernelServer::send_shell_impl(xeus::xmessage message) {
    xserver_zmq::send_shell_impl(fix_reply(std::move(message)));
}

// Control replies made on the main thread go out through the control thread, which alone
// uses the control socket ([Note: the control thread]).
void KernelServer::send_control_impl(xeus::xmessage message) {
    zmq::multipart_t wire = xeus::xzmq_serializer::serialize(fix_reply(std::move(message)),
                                                             *p_auth, m_error_handler);
    wire.send(m_control_main);
}

// [Note: the control thread]
// The main thread runs cells, so a control request it had to read itself waited for the cell
// to end: an interrupt_request sent as a message never interrupted anything, and a
// shutdown_request was answered when the cell ended (a review probe against ipykernel, which
// serves control on a thread of its own). Here a thread owns the control socket. It answers an
// interrupt_request itself, at once, after sending SIGINT to the process: while a cell runs the
// main thread alone accepts SIGINT (signals.hpp) and the cell gets
// KeyboardInterrupt, as with interrupt_mode "signal"; between cells it is ignored. Every other
// control request is handed to the main thread through an inproc pipe, and xeus answers it
// there; the replies come back through the pipe. A shutdown_request also interrupts a running
// cell first, as jupyter_client's shutdown does with a signal, so the main thread gets to it.
// A kernel_info_request is answered there too, from the last reply xeus made. Not yet: a
// debug_request waits for the cell to end (kernel_info says there is no debugger).
// The thread checks signatures with an authenticator of its own (xeus's is not shared across
// threads), and SIGINT stays blocked in it (inherited from main).
void KernelServer::control_loop() {
    for (;;) {
        zmq::pollitem_t items[] = {{m_controller.handle(), 0, ZMQ_POLLIN, 0},
                                   {m_control_side.handle(), 0, ZMQ_POLLIN, 0}};
        try {
            zmq::poll(&items[0], 2, std::chrono::milliseconds(-1));
        } catch (const zmq::error_t& e) {
            if (is_eintr(e)) continue;
            std::cerr << "magpy-kernel: control poll failed: " << e.what() << std::endl;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            zmq::multipart_t out;
            try {
                if (out.recv(m_control_side, ZMQ_DONTWAIT)) {
                    if (out.size() == 1 && out.peekstr(0) == "stop") {
                        out.send(m_control_side);  // the acknowledgement
                        return;
                    }
                    out.send(m_controller);
                }
            } catch (const zmq::error_t& e) {
                if (!is_eintr(e)) std::cerr << "magpy-kernel: control send failed: " << e.what()
                                            << std::endl;
            }
        }
        if (items[0].revents & ZMQ_POLLIN) {
            zmq::multipart_t wire;
            try {
                if (!wire.recv(m_controller, ZMQ_DONTWAIT)) continue;
            } catch (const zmq::error_t& e) {
                if (!is_eintr(e)) std::cerr << "magpy-kernel: control receive failed: "
                                            << e.what() << std::endl;
                continue;
            }
            if (control_message(wire)) wire.send(m_control_side);
        }
    }
}

// Handles what the control thread answers itself; true to hand the message to the main thread.
bool KernelServer::control_message(zmq::multipart_t& wire) {
    std::string type;
    xeus::xmessage msg;
    try {
        zmq::multipart_t copy = wire.clone();
        msg = xeus::xzmq_serializer::deserialize(copy, *m_control_auth);
        type = msg_type_of(msg.header());
    } catch (const std::exception& e) {
        std::cerr << "magpy-kernel: dropped a control message that could not be read: "
                  << e.what() << std::endl;
        return false;
    }
    // As ipykernel: the kernel's process group when it leads one (jupyter_client starts it so),
    // which also stops a child the cell waits for (os.system ignores SIGINT in its caller).
    auto interrupt = [] {
        if (::getpgid(0) == ::getpid()) ::killpg(::getpid(), SIGINT);
        else ::kill(::getpid(), SIGINT);
    };
    if (type == "shutdown_request") interrupt();
    nl::json content;
    if (type == "kernel_info_request") {
        // answered from the reply xeus last made (it does not change), so that a frontend's
        // check while a cell runs gets it at once, as from ipykernel
        std::lock_guard<std::mutex> lock(m_info_lock);
        if (m_kernel_info.is_null()) return true;  // none yet: the main thread answers
        content = m_kernel_info;
    } else if (type == "interrupt_request") {
        content = nl::json{{"status", "ok"}};
    } else {
        return true;
    }
    publish_status(msg.header(), "busy");
    if (type == "interrupt_request") interrupt();
    const std::string reply_type = type.substr(0, type.size() - 8) + "_reply";  // "_request"
    nl::json header = xeus::make_header(reply_type, xeus::get_user_name(), m_session);
    xeus::xmessage reply(msg.identities(), fixed_header(header), msg.header(), nl::json::object(),
                         std::move(content), xeus::buffer_sequence());
    try {
        xeus::xzmq_serializer::serialize(std::move(reply), *m_control_auth, m_error_handler)
            .send(m_controller);
    } catch (const std::exception& e) {
        std::cerr << "magpy-kernel: could not answer a " << type << ": " << e.what()
                  << std::endl;
    }
    publish_status(msg.header(), "idle");
    return false;
}

// The status of a request the control thread answers itself, as xeus publishes for the others.
void KernelServer::publish_status(const nl::json& parent, const char* state) {
    try {
        publish_impl(xeus::xpub_message(m_topic_prefix + "status",
                                        xeus::make_header("status", xeus::get_user_name(),
                                                          m_session),
                                        parent, nl::json::object(),
                                        nl::json{{"execution_state", state}},
                                        xeus::buffer_sequence()),
                     xeus::channel::CONTROL);
    } catch (const std::exception& e) {
        std::cerr << "magpy-kernel: could not publish a status: " << e.what() << std::endl;
    }
}

// The replies already handed to the control thread go out before it ends.
void KernelServer::stop_control_thread() {
    if (!m_control_thread.joinable()) return;
    try {
        zmq::message_t stop("stop", 4);
        m_control_main.send(stop, zmq::send_flags::none);
        zmq::pollitem_t item = {m_control_main.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(1000));
        if (item.revents & ZMQ_POLLIN) {
            zmq::message_t ack;
            (void)m_control_main.recv(ack, zmq::recv_flags::dontwait);
            m_control_thread.join();
            return;
        }
    } catch (const zmq::error_t&) {
    }
    m_control_thread.detach();  // (the process ends next)
}

// Sends an input_request and waits for its reply. Replaces xeus's blocking recv, which dies on
// EINTR, and fixes the request's `pwd` key (the protocol says `password`).
void KernelServer::send_stdin_impl(xeus::xmessage message) {
    nl::json content = message.content();
    if (content.contains("pwd")) {
        content["password"] = content["pwd"];
        content.erase("pwd");
    }
    xeus::xmessage request(message.identities(), fixed_header(message.header()),
                           message.parent_header(), message.metadata(), std::move(content),
                           xeus::buffer_sequence());

    // A reply that arrived after an earlier, interrupted request must not answer this one.
    for (;;) {
        zmq::multipart_t stale;
        try {
            if (!stale.recv(m_stdin, ZMQ_DONTWAIT)) break;
        } catch (const zmq::error_t&) {
            break;
        }
    }

    zmq::multipart_t wire = xeus::xzmq_serializer::serialize(std::move(request), *p_auth,
                                                             m_error_handler);
    wire.send(m_stdin);

    for (;;) {
        zmq::pollitem_t item = {m_stdin.handle(), 0, ZMQ_POLLIN, 0};
        try {
            zmq::poll(&item, 1, std::chrono::milliseconds(-1));
        } catch (const zmq::error_t& e) {
            if (!is_eintr(e)) throw;
            if (m_stdin_interrupt_check && m_stdin_interrupt_check()) throw StdinInterrupted{};
            continue;
        }
        if (!(item.revents & ZMQ_POLLIN)) continue;
        zmq::multipart_t wire_reply;
        try {
            if (!wire_reply.recv(m_stdin, ZMQ_DONTWAIT)) continue;
        } catch (const zmq::error_t& e) {
            if (!is_eintr(e)) throw;
            continue;
        }
        xeus::xmessage reply;
        try {
            reply = xeus::xzmq_serializer::deserialize(wire_reply, *p_auth);
        } catch (const std::exception& e) {
            std::cerr << "magpy-kernel: dropped an unreadable stdin message: " << e.what()
                      << std::endl;
            continue;
        }
        if (msg_type_of(reply.header()) != "input_reply") continue;
        notify_stdin_listener(std::move(reply));
        return;
    }
}

}  // namespace magpy_kernel
