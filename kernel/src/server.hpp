// The kernel's ZeroMQ server: xeus's xserver_zmq with its main loop, publishing and stdin
// replaced, and the protocol bugs of xeus 2.4.1 fixed on the way out. See
// /work/shared/notes/kernel.md §1.5-1.8 for the traps behind each override.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "zmq_addon.hpp"

#include "xeus/xauthentication.hpp"
#include "xeus/xeus_context.hpp"
#include "xeus/xserver_zmq.hpp"

namespace magpy_kernel {

// The protocol's execution counter: it grows only for requests that store history (xeus 2.4.1
// also counts store_history=false). The server sees each request first, so it keeps it.
struct ExecutionCounter {
    int current = 0;  // main thread only
};

class KernelServer final : public xeus::xserver_zmq {
public:
    KernelServer(zmq::context_t& context, const xeus::xconfiguration& config,
                 nl::json::error_handler_t eh);

    // The server of this process (there is one); null before xkernel builds it.
    static KernelServer* current();
    // xkernel's server_builder (a plain function pointer).
    static std::unique_ptr<xeus::xserver> build(xeus::xcontext& context,
                                                const xeus::xconfiguration& config,
                                                nl::json::error_handler_t eh);

    ExecutionCounter& counter() { return m_counter; }

    // Called when a wait for an input_reply is interrupted by a signal (main thread, no GIL);
    // returns true to abandon the wait (the caller then raises KeyboardInterrupt).
    void set_stdin_interrupt_check(std::function<bool()> check) {
        m_stdin_interrupt_check = std::move(check);
    }

    // Called on the main thread (no GIL) before each wait for a request, told whether the fd it
    // last named became readable: runs work due in the cells' asyncio loop and returns how long
    // the wait may last, in ms (-1: until a request), and an fd that also ends it (-1: none).
    struct IdleWait {
        long timeout_ms = -1;
        int fd = -1;
    };
    void set_idle_work(std::function<IdleWait(bool)> work) { m_idle_work = std::move(work); }

    // Thrown out of an abandoned stdin wait. Not a std::exception on purpose: xeus's handlers
    // catch std::exception and would swallow it.
    struct StdinInterrupted {};

private:
    void start_impl(xeus::xpub_message message) override;
    void update_config_impl(xeus::xconfiguration& config) const override;
    void publish_impl(xeus::xpub_message message, xeus::channel c) override;
    void send_shell_impl(xeus::xmessage message) override;
    void send_control_impl(xeus::xmessage message) override;
    void send_stdin_impl(xeus::xmessage message) override;

    void abort_queue_impl(const listener& abort, long polling_interval) override;

    void poll_once(long timeout_ms, int extra_fd = -1);
    void control_loop();
    bool control_message(zmq::multipart_t& wire);
    void publish_status(const nl::json& parent, const char* state);
    void stop_control_thread();
    void handle_shell(xeus::xmessage msg);
    template <class F>
    void guarded(F&& receive_and_handle);  // logs and drops what cannot be read
    void note_request(const xeus::xmessage& msg);
    xeus::xmessage fix_reply(xeus::xmessage message);

    // IOPub, bound here and written directly (see [Note: IOPub without a publisher thread]);
    // several threads publish, so every send holds m_socket.
    zmq::socket_t m_iopub;
    std::mutex m_socket;
    ExecutionCounter m_counter;
    std::function<bool()> m_stdin_interrupt_check;
    std::function<IdleWait(bool)> m_idle_work;
    bool m_idle_fd_ready = false;
    std::deque<xeus::xmessage> m_deferred;  // shell requests kept back by abort_queue_impl
    // [Note: the control thread]
    zmq::socket_t m_control_main;  // the main thread's end of the pipe to the control thread
    zmq::socket_t m_control_side;  // the control thread's end; it alone uses m_controller
    std::unique_ptr<xeus::xauthentication> m_control_auth;  // the control thread's own
    std::string m_session;
    std::string m_topic_prefix;  // "kernel_core.<id>." of IOPub topics
    std::mutex m_info_lock;
    nl::json m_kernel_info;  // the content of the last kernel_info_reply xeus made (guarded)
    std::thread m_control_thread;
};

}  // namespace magpy_kernel
