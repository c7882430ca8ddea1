// Everything the kernel itself sends on IOPub (stream text, displays, results, errors) goes
// through IOPub. Why not xeus's xinterpreter::publish_* helpers: they read xeus's "current
// parent" without a lock and must run on the main thread, while output comes from any thread
// (user threads, torch's threads, a captured file descriptor) and must keep its order.
//
// Design: writers append text to a buffer under a short lock and never touch a socket. Text
// is published (coalesced: consecutive writes to one stream become one message) by a timer
// thread every kFlushInterval, by the writer itself past kFlushBytes, and before any other
// message, so text keeps its place among displays. One "send" lock orders all of it; the
// server's socket lock is taken inside (see server.hpp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "xeus/xmessage.hpp"

namespace magpy_kernel {

namespace nl = nlohmann;

enum class Stream { kStdout = 0, kStderr = 1 };

class IOPub {
public:
    using Sink = std::function<void(xeus::xpub_message)>;

    static constexpr std::chrono::milliseconds kFlushInterval{50};
    static constexpr std::size_t kFlushBytes = 64 * 1024;

    static IOPub& instance();

    // Starts publishing through `sink` (thread-safe, provided by the server once it runs).
    void attach(Sink sink, std::string user_name, std::string session, std::string topic_prefix);
    // Flushes, then drops whatever comes later (the kernel is exiting).
    void detach();

    // The request that outputs belong to from now on (the running cell's execute_request).
    // Text written before is flushed under the previous parent first.
    void set_parent(nl::json parent_header);
    nl::json parent();

    // Any thread. Bytes need not be valid UTF-8; they are made valid when published.
    void write(Stream stream, std::string_view bytes);
    // Any thread: publishes buffered text now.
    void flush();
    // Any thread: flushes text, then sends one message with the current parent.
    void publish(const std::string& msg_type, nl::json content,
                 nl::json metadata = nl::json::object(),
                 xeus::buffer_sequence buffers = xeus::buffer_sequence());

    // The timer thread behind time-based flushing. Call with SIGINT blocked.
    void start_flusher();

    // Points fds 1 and 2 at pipes read by a thread, so output of C code and subprocesses
    // (os.system, printf in an extension) reaches the notebook. Returns false (and leaves the
    // fds alone) on failure. Call with SIGINT blocked.
    bool capture_fds();
    bool fds_captured() const { return m_captured; }
    // Main thread, end of a cell: flush C stdio and wait (bounded) until everything written to
    // the captured fds so far is in the buffer.
    void drain_fds();
    // The kernel's own diagnostics go here (the terminal Jupyter started us from), never into
    // a notebook. Valid from the start.
    static int log_fd();

private:
    IOPub() = default;
    void flush_locked();  // PRECONDITION: m_send held
    void send_locked(const std::string& msg_type, nl::json content, nl::json metadata,
                     xeus::buffer_sequence buffers = xeus::buffer_sequence());
    void flusher_loop();
    void reader_loop();
    void append_locked(Stream stream, std::string_view bytes);  // PRECONDITION: m_buffer held
    void pull_fds_locked();  // non-blocking read of the captured fds; PRECONDITION: m_buffer held
    nl::json make_header(const std::string& msg_type);

    // m_send orders publishing; m_buffer guards the text buffer. Order: m_send, then m_buffer.
    std::mutex m_send;
    std::mutex m_buffer;
    std::condition_variable m_wake;

    struct Segment {
        Stream stream;
        std::string bytes;
    };
    std::vector<Segment> m_segments;  // guarded by m_buffer
    std::size_t m_pending_bytes = 0;  // guarded by m_buffer
    std::chrono::steady_clock::time_point m_first_pending;  // guarded by m_buffer
    bool m_stopping = false;          // guarded by m_buffer

    Sink m_sink;                      // guarded by m_send
    nl::json m_parent = nl::json::object();  // guarded by m_send
    std::string m_user_name, m_session, m_topic_prefix;  // guarded by m_send
    unsigned long long m_rng_state = 0;  // guarded by m_send

    bool m_captured = false;
    int m_pipe_read[2] = {-1, -1};     // read ends for stdout, stderr
    std::string m_carry[2];            // an unfinished UTF-8 sequence per fd; guarded by m_buffer
};

}  // namespace magpy_kernel
