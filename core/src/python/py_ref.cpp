#include "python/py_ref.h"

namespace magpy::py {

static thread_local PyObject* t_interrupt[3] = {nullptr, nullptr, nullptr};

void clear_error_keep_interrupt() {
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) && !t_interrupt[0]) {
        PyErr_Fetch(&t_interrupt[0], &t_interrupt[1], &t_interrupt[2]);
        return;
    }
    PyErr_Clear();
}

bool interrupt_pending() { return t_interrupt[0] != nullptr; }

bool take_interrupt() {
    if (!t_interrupt[0]) return false;
    PyErr_Restore(t_interrupt[0], t_interrupt[1], t_interrupt[2]);
    t_interrupt[0] = t_interrupt[1] = t_interrupt[2] = nullptr;
    return true;
}

static std::string to_utf8(PyObject* s) {
    if (!s) return {};
    Py_ssize_t n = 0;
    const char* c = PyUnicode_AsUTF8AndSize(s, &n);
    if (!c) {
        clear_error_keep_interrupt();
        return "<unprintable>";
    }
    return std::string(c, static_cast<size_t>(n));
}

std::string repr_string(PyObject* o) {
    if (!o) return "NULL";
    Ref r = Ref::steal(PyObject_Repr(o));
    if (!r) {
        clear_error_keep_interrupt();
        return "<" + type_name(o) + " object>";
    }
    return to_utf8(r.get());
}

std::string str_of(PyObject* o) {
    if (!o) return "NULL";
    Ref r = Ref::steal(PyObject_Str(o));
    if (!r) {
        PyErr_Clear();
        return repr_string(o);
    }
    return to_utf8(r.get());
}

std::string type_name(PyObject* o) { return o ? Py_TYPE(o)->tp_name : "NULL"; }

std::string fetch_error_string() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type) return "";
    PyErr_NormalizeException(&type, &value, &tb);
    std::string s = reinterpret_cast<PyTypeObject*>(type)->tp_name;
    if (value) s += ": " + str_of(value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return s;
}

}  // namespace magpy::py
