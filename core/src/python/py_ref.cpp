#include "python/py_ref.h"

namespace magpy::py {

static std::string to_utf8(PyObject* s) {
    if (!s) return {};
    Py_ssize_t n = 0;
    const char* c = PyUnicode_AsUTF8AndSize(s, &n);
    if (!c) {
        PyErr_Clear();
        return "<unprintable>";
    }
    return std::string(c, static_cast<size_t>(n));
}

std::string repr_string(PyObject* o) {
    if (!o) return "NULL";
    Ref r = Ref::steal(PyObject_Repr(o));
    if (!r) {
        PyErr_Clear();
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
