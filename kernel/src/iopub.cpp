#include "iopub.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <random>
#include <streambuf>

#include "json_bridge.hpp"

namespace magpy_kernel {

namespace {

int g_log_fd = 2;

// std::cout / std::cerr of the kernel itself (xeus prints diagnostics there) go to the
// original terminal, not into the captured fds that lead to a notebook.
class FdStreamBuf : public std::streambuf {
public:
    explicit FdStreamBuf(int fd) : m_fd(fd) {}

protected:
    int overflow(int c) override {
        if (c == traits_type::eof()) return 0;
        const char ch = static_cast<char>(c);
        return ::write(m_fd, &ch, 1) == 1 ? c : traits_type::eof();
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        std::streamsize done = 0;
        while (done < n) {
            const ssize_t k = ::write(m_fd, s + done, static_cast<std::size_t>(n - done));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            done += k;
        }
        return done;
    }

private:
    int m_fd;
};

const char* stream_name(Stream s) { return s == Stream::kStdout ? "stdout" : "stderr"; }

std::string iso8601_now() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
                            now.time_since_epoch()).count() % 1000000;
    std::tm tm{};
    gmtime_r(&t, &tm);  // gmtime is not thread-safe; several threads publish
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<long long>(micros));
    return buf;
}

}  // namespace

IOPub& IOPub::instance() {
    static IOPub* hub = new IOPub();  // never destroyed: threads may still use it at exit
    return *hub;
}

int IOPub::log_fd() { return g_log_fd; }

void IOPub::attach(Sink sink, std::string user_name, std::string session,
                   std::string topic_prefix) {
    std::lock_guard<std::mutex> send(m_send);
    m_sink = std::move(sink);
    m_user_name = std::move(user_name);
    m_session = std::move(session);
    m_topic_prefix = std::move(topic_prefix);
    std::random_device rd;
    m_rng_state = (static_cast<unsigned long long>(rd()) << 32) ^ rd() ^
                  static_cast<unsigned long long>(
                      std::chrono::steady_clock::now().time_since_epoch().count());
}

void IOPub::detach() {
    {
        std::lock_guard<std::mutex> send(m_send);
        flush_locked();
        m_sink = nullptr;
    }
    std::lock_guard<std::mutex> buf(m_buffer);
    m_stopping = true;
    m_wake.notify_all();
}

void IOPub::set_parent(nl::json parent_header) {
    std::lock_guard<std::mutex> send(m_send);
    flush_locked();
    m_parent = std::move(parent_header);
}

nl::json IOPub::parent() {
    std::lock_guard<std::mutex> send(m_send);
    return m_parent;
}

void IOPub::append_locked(Stream stream, std::string_view bytes) {
    if (bytes.empty()) return;
    if (m_segments.empty()) {
        m_first_pending = std::chrono::steady_clock::now();
        m_wake.notify_one();
    }
    if (!m_segments.empty() && m_segments.back().stream == stream) {
        m_segments.back().bytes.append(bytes.data(), bytes.size());
    } else {
        m_segments.push_back({stream, std::string(bytes)});
    }
    m_pending_bytes += bytes.size();
}

void IOPub::pull_fds_locked() {
    if (!m_captured) return;
    char chunk[16 * 1024];
    for (int i = 0; i < 2; ++i) {
        for (;;) {
            const ssize_t n = ::read(m_pipe_read[i], chunk, sizeof chunk);
            if (n <= 0) break;
            std::string& carry = m_carry[i];
            carry.append(chunk, static_cast<std::size_t>(n));
            const std::size_t keep = complete_utf8_prefix(carry);
            append_locked(static_cast<Stream>(i), std::string_view(carry).substr(0, keep));
            carry.erase(0, keep);
        }
    }
}

void IOPub::write(Stream stream, std::string_view bytes) {
    bool big;
    {
        std::lock_guard<std::mutex> buf(m_buffer);
        // What was written to fd 1/2 before this write comes first (os.write, then print).
        pull_fds_locked();
        append_locked(stream, bytes);
        big = m_pending_bytes >= kFlushBytes;
    }
    if (big) flush();  // size-based: the writer pays, which also slows down a runaway loop
}

void IOPub::flush() {
    std::lock_guard<std::mutex> send(m_send);
    flush_locked();
}

void IOPub::flush_locked() {
    if (!m_sink) return;  // not started yet: keep the text
    std::vector<Segment> segments;
    {
        std::lock_guard<std::mutex> buf(m_buffer);
        // What this thread (or any) wrote to fd 1/2 before now comes before what is published
        // next (`os.write(1, ...)` then the cell's value: an audit found it after the
        // execute_result in about one cell in ten)
        pull_fds_locked();
        segments.swap(m_segments);
        m_pending_bytes = 0;
    }
    for (auto& seg : segments) {
        nl::json content = {{"name", stream_name(seg.stream)},
                            {"text", sanitize_utf8(seg.bytes)}};
        send_locked("stream", std::move(content), nl::json::object());
    }
}

void IOPub::publish(const std::string& msg_type, nl::json content, nl::json metadata,
                    xeus::buffer_sequence buffers) {
    std::lock_guard<std::mutex> send(m_send);
    flush_locked();
    send_locked(msg_type, std::move(content), std::move(metadata), std::move(buffers));
}

nl::json IOPub::make_header(const std::string& msg_type) {
    // splitmix64: cheap, and unique enough for message ids (guarded by m_send).
    auto next = [this]() {
        unsigned long long z = (m_rng_state += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    };
    const unsigned long long a = next(), b = next();
    char id[40];
    std::snprintf(id, sizeof id, "%08llx-%04llx-4%03llx-%04llx-%012llx", a >> 32,
                  (a >> 16) & 0xFFFF, a & 0xFFF, ((b >> 48) & 0x3FFF) | 0x8000,
                  b & 0xFFFFFFFFFFFFULL);
    return {{"msg_id", id},           {"username", m_user_name}, {"session", m_session},
            {"date", iso8601_now()},  {"msg_type", msg_type},    {"version", "5.3"}};
}

void IOPub::send_locked(const std::string& msg_type, nl::json content, nl::json metadata,
                        xeus::buffer_sequence buffers) {
    if (!m_sink) return;
    try {
        xeus::xpub_message msg(m_topic_prefix + msg_type, make_header(msg_type), m_parent,
                               std::move(metadata), std::move(content), std::move(buffers));
        m_sink(std::move(msg));
    } catch (const std::exception& e) {
        std::cerr << "magpy-kernel: could not publish " << msg_type << ": " << e.what()
                  << std::endl;
    }
}

void IOPub::start_flusher() {
    std::thread([this] { flusher_loop(); }).detach();
}

void IOPub::flusher_loop() {
    std::unique_lock<std::mutex> lk(m_buffer);
    for (;;) {
        m_wake.wait(lk, [this] { return m_stopping || !m_segments.empty(); });
        if (m_stopping) return;
        const auto due = m_first_pending + kFlushInterval;
        if (std::chrono::steady_clock::now() < due) {
            m_wake.wait_until(lk, due, [this] { return m_stopping; });
            continue;  // re-check: someone may have flushed, or a new batch started
        }
        lk.unlock();
        flush();
        lk.lock();
    }
}

bool IOPub::capture_fds() {
    int saved[2] = {-1, -1};
    int pipes[2][2];
    for (int i = 0; i < 2; ++i) {
        if (::pipe2(pipes[i], O_CLOEXEC) != 0) {
            std::cerr << "magpy-kernel: no fd capture (pipe failed)" << std::endl;
            return false;
        }
    }
    saved[0] = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
    saved[1] = ::fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (saved[0] < 0 || saved[1] < 0) return false;
    std::fflush(nullptr);
    for (int i = 0; i < 2; ++i) {
        ::dup2(pipes[i][1], i + 1);  // dup2'd fds are inherited by subprocesses, as they should be
        ::close(pipes[i][1]);
        ::fcntl(pipes[i][0], F_SETFL, ::fcntl(pipes[i][0], F_GETFL) | O_NONBLOCK);
        m_pipe_read[i] = pipes[i][0];
    }
    g_log_fd = saved[1];
    static FdStreamBuf out_buf(saved[0]);
    static FdStreamBuf err_buf(saved[1]);
    std::cout.rdbuf(&out_buf);
    std::cerr.rdbuf(&err_buf);
    std::clog.rdbuf(&err_buf);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // C code's printf reaches the pipe per line
    m_captured = true;
    std::thread([this] { reader_loop(); }).detach();
    return true;
}

void IOPub::reader_loop() {
    pollfd fds[2] = {{m_pipe_read[0], POLLIN, 0}, {m_pipe_read[1], POLLIN, 0}};
    for (;;) {
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        bool big = false;
        for (int i = 0; i < 2; ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
            // Read under the buffer lock: drain_fds() relies on it (see there).
            std::lock_guard<std::mutex> buf(m_buffer);
            pull_fds_locked();
            big = m_pending_bytes >= kFlushBytes;
        }
        if (big) flush();
    }
}

void IOPub::drain_fds() {
    if (!m_captured) return;
    std::fflush(nullptr);
    // Once both pipes are empty, every byte written before now has been read by the reader,
    // and it appends under m_buffer in the same critical section as the read, so taking
    // m_buffer afterwards waits for the last append.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < give_up) {
        int a = 0, b = 0;
        ::ioctl(m_pipe_read[0], FIONREAD, &a);
        ::ioctl(m_pipe_read[1], FIONREAD, &b);
        if (a == 0 && b == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard<std::mutex> buf(m_buffer);
    for (int i = 0; i < 2; ++i) {  // an unfinished character stays with its cell
        append_locked(static_cast<Stream>(i), m_carry[i]);
        m_carry[i].clear();
    }
}

}  // namespace magpy_kernel
