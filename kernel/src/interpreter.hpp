// The xeus interpreter: each request is answered by the IPython shell in the embedded CPython
// (kernel/python/magpy_kernel.py), with the GIL taken per request and released in between so
// that Python threads run while the kernel waits.
#pragma once

#include <string>

#include "xeus/xinterpreter.hpp"

namespace magpy_kernel {

class MagpyInterpreter final : public xeus::xinterpreter {
public:
    MagpyInterpreter();

private:
    void configure_impl() override;
    nl::json execute_request_impl(int execution_counter, const std::string& code, bool silent,
                                  bool store_history, nl::json user_expressions,
                                  bool allow_stdin) override;
    nl::json complete_request_impl(const std::string& code, int cursor_pos) override;
    nl::json inspect_request_impl(const std::string& code, int cursor_pos,
                                  int detail_level) override;
    nl::json is_complete_request_impl(const std::string& code) override;
    nl::json kernel_info_request_impl() override;
    void shutdown_request_impl() override;

    nl::json m_kernel_info;  // computed once at start-up, so kernel_info needs no GIL
};

// Imports the Python side of the kernel from the source compiled into this executable.
// PRECONDITION: GIL held.
void import_glue_module();

}  // namespace magpy_kernel
