// Conversions between Python objects and JSON, and UTF-8 hygiene for everything the kernel
// sends. Frontends require valid UTF-8; user code can print anything (raw bytes, lone
// surrogates), so every text is made valid here rather than trusted.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

namespace magpy_kernel {

namespace nl = nlohmann;
namespace py = pybind11;

// Returns `bytes` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string sanitize_utf8(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside a multi-byte sequence that
// could still be completed by more bytes (pipe reads split characters anywhere).
std::size_t complete_utf8_prefix(std::string_view bytes);

// UTF-8 of a Python str; lone surrogates become '?'. Never throws for a str.
// PRECONDITION: GIL held. `text` borrowed.
std::string utf8_of(py::handle text);

// JSON of a Python value: dict/list/tuple/str/int/float/bool/None map directly, bytes become
// base64 (image data); sets, ranges, numpy arrays and scalars, Fractions and datetimes as
// ipykernel's session makes them; anything else its str(). Never throws for user data.
// PRECONDITION: GIL held. `obj` borrowed.
nl::json to_json(py::handle obj);

// Python value of a JSON value (new reference). PRECONDITION: GIL held.
py::object from_json(const nl::json& value);

}  // namespace magpy_kernel
