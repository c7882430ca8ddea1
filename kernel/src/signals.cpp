#include "signals.hpp"

#include <pthread.h>
#include <signal.h>

#include <Python.h>

namespace magpy_kernel {

namespace {

void set_sigint_mask(int how) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    pthread_sigmask(how, &set, nullptr);
}

// Runs tripped Python signal handlers now and forgets what they raised, keeping any error
// that was already set. PRECONDITION: GIL held.
void drain_tripped_signals() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);  // steals the current error, if any
    if (PyErr_CheckSignals() != 0) PyErr_Clear();
    PyErr_Restore(type, value, tb);   // gives it back
}

}  // namespace

void block_sigint() { set_sigint_mask(SIG_BLOCK); }

SigintWindow::SigintWindow() {
    // SIG_IGN discards a SIGINT left pending while idle (POSIX: even if blocked).
    PyOS_setsig(SIGINT, SIG_IGN);
    drain_tripped_signals();
    // As ipykernel: the cell sees Python's default handler, even if an earlier cell changed it.
    // _signal.signal, not signal.signal: the latter converts its result to an enum, which for
    // a function handler raises and catches an exception on every cell (several microseconds
    // of every request). Both are looked up once (kept for the process).
    static PyObject* set_handler = nullptr;   // _signal.signal
    static PyObject* default_handler = nullptr;  // _signal.default_int_handler
    if (set_handler == nullptr) {
        PyObject* signal_module = PyImport_ImportModule("_signal");
        if (signal_module != nullptr) {
            set_handler = PyObject_GetAttrString(signal_module, "signal");
            default_handler = PyObject_GetAttrString(signal_module, "default_int_handler");
            Py_DECREF(signal_module);
        }
        if (set_handler == nullptr || default_handler == nullptr) {
            Py_CLEAR(set_handler);
            Py_CLEAR(default_handler);
        }
    }
    if (set_handler != nullptr) {
        PyObject* r = PyObject_CallFunction(set_handler, "iO", SIGINT, default_handler);
        Py_XDECREF(r);
    }
    if (PyErr_Occurred()) PyErr_Clear();
    set_sigint_mask(SIG_UNBLOCK);
}

SigintWindow::~SigintWindow() {
    set_sigint_mask(SIG_BLOCK);
    // A SIGINT that came after the cell's last bytecode must not fire in later Python calls.
    drain_tripped_signals();
    PyOS_setsig(SIGINT, SIG_IGN);
}

}  // namespace magpy_kernel
