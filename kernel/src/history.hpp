// history_request answered from IPython's HistoryManager (the sqlite database ipykernel uses),
// because xeus 2.4.1's in-memory manager is not conformant (string session and line numbers,
// line always 1, flat entries for output=True; /work/shared/notes/kernel.md §1.7).
#pragma once

#include "xeus/xhistory_manager.hpp"

namespace magpy_kernel {

class IPythonHistory final : public xeus::xhistory_manager {
private:
    void configure_impl() override {}
    // IPython stores each cell itself (run_cell with store_history), numbered by our counter.
    void store_inputs_impl(int, int, const std::string&, const std::string&) override {}
    nl::json get_tail_impl(int n, bool raw, bool output) const override;
    nl::json get_range_impl(int session, int start, int stop, bool raw,
                            bool output) const override;
    nl::json search_impl(const std::string& pattern, bool raw, bool output, int n,
                         bool unique) const override;
};

}  // namespace magpy_kernel
