/* Exposes CPython 3.11's private opcode tables, which libpython does not export. This is C
 * because the header uses designated initialisers that C++17 rejects. */
#include <Python.h>
#define Py_BUILD_CORE 1
#define NEED_OPCODE_TABLES
#include <internal/pycore_opcode.h>

const unsigned char* const magpy_opcode_deopt = _PyOpcode_Deopt;
const unsigned char* const magpy_opcode_caches = _PyOpcode_Caches;
