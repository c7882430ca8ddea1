// SIGINT handling that makes interrupt_mode "signal" safe with xeus 2.4.1, whose threads call
// zmq::poll without handling EINTR (a SIGINT while idle kills a naive kernel). The recipe
// (verified, /work/shared/notes/kernel.md §1.6): SIGINT is blocked in every thread, except in
// the main thread while a cell runs; between cells it is ignored, so an idle interrupt is a
// no-op and never lingers into the next cell.
#pragma once

namespace magpy_kernel {

// Call once in main, before any thread starts (threads inherit the mask).
void block_sigint();

// RAII: SIGINT raises KeyboardInterrupt in the main thread while alive.
// PRECONDITION: GIL held, main thread.
class SigintWindow {
public:
    SigintWindow();
    ~SigintWindow();
    SigintWindow(const SigintWindow&) = delete;
    SigintWindow& operator=(const SigintWindow&) = delete;
};

}  // namespace magpy_kernel
