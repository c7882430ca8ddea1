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
    PyObject* signal_module = PyImport_ImportModule("signal");  // new reference
    PyObject* handler = signal_module != nullptr
                            ? PyObject_GetAttrString(signal_module, "default_int_handler")
                            : nullptr;  // new reference
    if (handler != nullptr) {
        PyObject* r = PyObject_CallMethod(signal_module, "signal", "iO", SIGINT, handler);
        Py_XDECREF(r);
    }
    Py_XDECREF(handler);
    Py_XDECREF(signal_module);
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
