// GoogleTest main for the core units: embeds Debian's Python (with torch) once for all tests.
#include <Python.h>
#include <gtest/gtest.h>

#include "python/torch_api.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;
    PyStatus st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "cannot start Python\n");
        return 2;
    }
    if (!magpy::init_torch_api()) {
        PyErr_Print();
        return 2;
    }
    int rc = RUN_ALL_TESTS();
    Py_FinalizeEx();
    return rc;
}
