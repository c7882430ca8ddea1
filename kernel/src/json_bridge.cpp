#include "json_bridge.hpp"

#include <cmath>

namespace magpy_kernel {

namespace {

constexpr int kMaxDepth = 200;  // deeper (or cyclic) values are cut, not recursed into
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at s[i], 0 if invalid, -1 if valid but truncated.
int sequence_length(std::string_view s, std::size_t i) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0) lo = 0xA0;  // overlong
        if (b0 == 0xED) hi = 0x9F;  // surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0) lo = 0x90;  // overlong
        if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
        return 0;
    }
    for (int k = 1; k < len; ++k) {
        if (i + k >= s.size()) return -1;
        const auto b = static_cast<unsigned char>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return len;
}

std::string base64(std::string_view in) {
    static const char* kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    std::size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                           (static_cast<unsigned char>(in[i + 1]) << 8) |
                           static_cast<unsigned char>(in[i + 2]);
        out += kAlphabet[(v >> 18) & 63];
        out += kAlphabet[(v >> 12) & 63];
        out += kAlphabet[(v >> 6) & 63];
        out += kAlphabet[v & 63];
    }
    if (i < in.size()) {
        unsigned v = static_cast<unsigned char>(in[i]) << 16;
        if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
        out += kAlphabet[(v >> 18) & 63];
        out += kAlphabet[(v >> 12) & 63];
        out += (i + 1 < in.size()) ? kAlphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

// PRECONDITION: GIL held. Returns "" (and clears the error) if str() itself fails.
std::string str_of(py::handle obj) {
    PyObject* s = PyObject_Str(obj.ptr());  // new reference
    if (s == nullptr) {
        PyErr_Clear();
        return std::string("<unprintable ") + Py_TYPE(obj.ptr())->tp_name + " object>";
    }
    std::string out = utf8_of(s);
    Py_DECREF(s);
    return out;
}

nl::json converted(py::handle obj, int depth);

nl::json to_json_at(py::handle obj, int depth) {
    PyObject* o = obj.ptr();
    if (depth > kMaxDepth) return "...";
    if (o == Py_None) return nullptr;
    if (PyBool_Check(o)) return o == Py_True;
    if (PyLong_Check(o)) {
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow == 0 && !(v == -1 && PyErr_Occurred())) return v;
        PyErr_Clear();
        if (overflow > 0) {
            const unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (!PyErr_Occurred()) return u;
            PyErr_Clear();
        }
        return str_of(obj);  // beyond 64 bits: keep every digit as text
    }
    if (PyFloat_Check(o)) {
        const double v = PyFloat_AS_DOUBLE(o);
        if (std::isfinite(v)) return v;
        return str_of(obj);  // JSON has no NaN or infinity
    }
    if (PyUnicode_Check(o)) return utf8_of(obj);
    if (PyBytes_Check(o)) {
        return base64(std::string_view(PyBytes_AS_STRING(o),
                                       static_cast<std::size_t>(PyBytes_GET_SIZE(o))));
    }
    if (PyByteArray_Check(o)) {
        return base64(std::string_view(PyByteArray_AS_STRING(o),
                                       static_cast<std::size_t>(PyByteArray_GET_SIZE(o))));
    }
    if (PyDict_Check(o)) {
        nl::json out = nl::json::object();
        PyObject* key;    // borrowed
        PyObject* value;  // borrowed
        Py_ssize_t pos = 0;
        while (PyDict_Next(o, &pos, &key, &value)) {
            const std::string k = PyUnicode_Check(key) ? utf8_of(key) : str_of(key);
            out[k] = to_json_at(value, depth + 1);
        }
        return out;
    }
    if (PyList_Check(o) || PyTuple_Check(o)) {
        nl::json out = nl::json::array();
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        for (Py_ssize_t i = 0; i < n; ++i) {
            out.push_back(to_json_at(PySequence_Fast_GET_ITEM(o, i), depth + 1));
        }
        return out;
    }
    return converted(obj, depth);
}

// A value of a module's type by name, or null (the module not imported, or no such name).
// Modules the user never imported cannot have made the value, so nothing is imported here.
PyObject* loaded_type(const char* module, const char* name) {
    PyObject* mod = PyImport_GetModule(py::str(module).ptr());  // new reference or null
    if (mod == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    PyObject* t = PyObject_GetAttrString(mod, name);  // new reference or null
    Py_DECREF(mod);
    if (t == nullptr) PyErr_Clear();
    return t;
}

bool is_instance(PyObject* o, const char* module, const char* name) {
    PyObject* t = loaded_type(module, name);
    if (t == nullptr) return false;
    const int r = PyObject_IsInstance(o, t);
    Py_DECREF(t);
    if (r < 0) PyErr_Clear();
    return r == 1;
}

// The JSON of `method(obj)` or of `obj.method()`; str(obj) if that fails.
nl::json via(py::handle obj, PyObject* result, int depth) {
    if (result == nullptr) {
        PyErr_Clear();
        return str_of(obj);
    }
    nl::json out = to_json_at(result, depth);
    Py_DECREF(result);
    return out;
}

// What ipykernel's session makes of values JSON lacks (jupyter_client's json_clean and
// json_default): sets, ranges and numpy arrays become lists, numbers.Integral and numbers.Real
// (numpy scalars, Fraction) become numbers, datetimes ISO 8601 text with the local offset when
// naive. Where ipykernel refuses a value (a Decimal, a date, any other object), its str().
// Generators are not drained: that would run user code and lose the items.
nl::json converted(py::handle obj, int depth) {
    PyObject* o = obj.ptr();
    if (PyAnySet_Check(o) || PyRange_Check(o)) return via(obj, PySequence_List(o), depth + 1);
    if (is_instance(o, "numpy", "ndarray"))
        return via(obj, PyObject_CallMethod(o, "tolist", nullptr), depth + 1);
    if (is_instance(o, "numbers", "Integral")) return via(obj, PyNumber_Index(o), depth + 1);
    if (is_instance(o, "numbers", "Real")) return via(obj, PyNumber_Float(o), depth + 1);
    if (is_instance(o, "datetime", "datetime")) {
        PyObject* tz = PyObject_GetAttrString(o, "tzinfo");  // new reference or null
        if (tz == nullptr) return via(obj, nullptr, depth);
        const bool naive = tz == Py_None;
        Py_DECREF(tz);
        PyObject* aware = naive ? PyObject_CallMethod(o, "astimezone", nullptr) : Py_NewRef(o);
        if (aware == nullptr) return via(obj, nullptr, depth);
        PyObject* text = PyObject_CallMethod(aware, "isoformat", nullptr);
        Py_DECREF(aware);
        if (text == nullptr) return via(obj, nullptr, depth);
        std::string iso = utf8_of(text);
        Py_DECREF(text);
        if (iso.size() >= 6 && iso.compare(iso.size() - 6, 6, "+00:00") == 0)
            iso.replace(iso.size() - 6, 6, "Z");
        return iso;
    }
    return str_of(obj);
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    std::size_t i = 0;
    while (i < bytes.size()) {
        const int len = sequence_length(bytes, i);
        if (len > 0) {
            out.append(bytes.data() + i, static_cast<std::size_t>(len));
            i += static_cast<std::size_t>(len);
        } else {
            out += kReplacement;
            i += 1;
        }
    }
    return out;
}

std::size_t complete_utf8_prefix(std::string_view bytes) {
    // Only the last 3 bytes can start an unfinished sequence.
    const std::size_t from = bytes.size() > 3 ? bytes.size() - 3 : 0;
    for (std::size_t i = from; i < bytes.size(); ++i) {
        if (sequence_length(bytes, i) == -1) return i;
    }
    return bytes.size();
}

std::string utf8_of(py::handle text) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
    if (data != nullptr) return std::string(data, static_cast<std::size_t>(size));
    PyErr_Clear();  // lone surrogates: each becomes U+FFFD, as the input() prompt's do (through
                    // UTF-16, where a lone surrogate is one unit the decoder replaces)
    py::object units = py::reinterpret_steal<py::object>(
        PyUnicode_AsEncodedString(text.ptr(), "utf-16-le", "surrogatepass"));
    py::object replaced = units ? py::reinterpret_steal<py::object>(PyUnicode_Decode(
                                      PyBytes_AS_STRING(units.ptr()), PyBytes_GET_SIZE(units.ptr()),
                                      "utf-16-le", "replace"))
                                : py::object();
    data = replaced ? PyUnicode_AsUTF8AndSize(replaced.ptr(), &size) : nullptr;
    if (data == nullptr) {
        PyErr_Clear();
        return "\xEF\xBF\xBD";
    }
    return std::string(data, static_cast<std::size_t>(size));
}

nl::json to_json(py::handle obj) { return to_json_at(obj, 0); }

py::object from_json(const nl::json& value) {
    switch (value.type()) {
        case nl::json::value_t::null:
            return py::none();
        case nl::json::value_t::boolean:
            return py::bool_(value.get<bool>());
        case nl::json::value_t::number_integer:
            return py::int_(value.get<long long>());
        case nl::json::value_t::number_unsigned:
            return py::int_(value.get<unsigned long long>());
        case nl::json::value_t::number_float:
            return py::float_(value.get<double>());
        case nl::json::value_t::string: {
            const auto& s = value.get_ref<const std::string&>();
            PyObject* u = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                                               "replace");  // new reference
            if (u == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(u);
        }
        case nl::json::value_t::array: {
            py::list out;
            for (const auto& item : value) out.append(from_json(item));
            return std::move(out);
        }
        case nl::json::value_t::object: {
            py::dict out;
            for (auto it = value.begin(); it != value.end(); ++it) {
                out[py::str(it.key())] = from_json(it.value());
            }
            return std::move(out);
        }
        default:
            return py::none();
    }
}

}  // namespace magpy_kernel
