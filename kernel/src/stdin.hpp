// input() and getpass() over the Jupyter stdin channel.
#pragma once

#include <string>

namespace magpy_kernel {

// Whether the running execute_request allows stdin; set for the duration of a cell.
class StdinScope {
public:
    explicit StdinScope(bool allowed);
    ~StdinScope();
    StdinScope(const StdinScope&) = delete;
    StdinScope& operator=(const StdinScope&) = delete;
    static bool allowed();
};

// Asks the frontend for a line. Raises (as a Python exception) KeyboardInterrupt when
// interrupted, RuntimeError outside the main thread or outside a cell.
// PRECONDITION: GIL held. The GIL is released while waiting, so other threads run.
std::string request_input(const std::string& prompt, bool password);

}  // namespace magpy_kernel
