// Owning smart pointer for PyObject*, and the GIL precondition helpers used across core/.
#pragma once

#include <Python.h>

#include <string>
#include <utility>

namespace magpy::py {

// Owns one strong reference. PRECONDITION: GIL held whenever a Ref is copied or destroyed.
class Ref {
public:
    Ref() = default;
    static Ref steal(PyObject* o) { return Ref(o); }       // takes a new reference
    static Ref borrow(PyObject* o) { Py_XINCREF(o); return Ref(o); }  // adds one
    Ref(const Ref& o) : m_obj(o.m_obj) { Py_XINCREF(m_obj); }
    Ref(Ref&& o) noexcept : m_obj(o.m_obj) { o.m_obj = nullptr; }
    Ref& operator=(Ref o) noexcept { std::swap(m_obj, o.m_obj); return *this; }
    ~Ref() { Py_XDECREF(m_obj); }

    PyObject* get() const { return m_obj; }          // borrowed
    PyObject* release() { PyObject* o = m_obj; m_obj = nullptr; return o; }  // new reference
    PyObject* new_ref() const { Py_XINCREF(m_obj); return m_obj; }
    explicit operator bool() const { return m_obj != nullptr; }

private:
    explicit Ref(PyObject* o) : m_obj(o) {}
    PyObject* m_obj = nullptr;
};

// A weak reference to a Python object, for identity guards: the cache never keeps a user's
// object alive. Objects that do not support weak references are held strongly only if they are
// immortal in practice (types, None, builtins); see WeakOrStrong::make.
class WeakOrStrong {
public:
    WeakOrStrong() = default;
    static WeakOrStrong make(PyObject* o);  // borrowed in
    // Borrowed; NULL when the object has died.
    PyObject* get() const;
    bool is_weak() const { return m_weak; }

private:
    Ref m_ref;
    bool m_weak = false;
};

inline WeakOrStrong WeakOrStrong::make(PyObject* o) {
    WeakOrStrong w;
    PyObject* wr = PyWeakref_NewRef(o, nullptr);
    if (wr) {
        w.m_ref = Ref::steal(wr);
        w.m_weak = true;
    } else {
        PyErr_Clear();
        w.m_ref = Ref::borrow(o);
    }
    return w;
}

inline PyObject* WeakOrStrong::get() const {
    if (!m_weak) return m_ref.get();
    PyObject* o = PyWeakref_GET_OBJECT(m_ref.get());
    return o == Py_None ? nullptr : o;
}

// Clears the current error, but keeps a KeyboardInterrupt (a signal handler that ran inside
// engine code) for take_interrupt(): the interrupt belongs to the program.
void clear_error_keep_interrupt();
// The KeyboardInterrupt kept by clear_error_keep_interrupt() (set as the current error), if any.
bool take_interrupt();
bool interrupt_pending();
std::string repr_string(PyObject* o);  // never fails; for messages
std::string str_of(PyObject* o);       // str(), never fails
std::string type_name(PyObject* o);
std::string fetch_error_string();      // consumes the current exception

}  // namespace magpy::py
