// Guard tree units: accessors fetch the right values, checks pass and fail on real objects, and
// the verbose check explains a miss in the user's terms.
#include <gtest/gtest.h>

#include "guards/guard_tree.h"

using namespace magpy;

namespace {
py::Ref eval(const char* expr) {
    py::Ref globals = py::Ref::steal(PyDict_New());
    PyDict_SetItemString(globals.get(), "__builtins__", PyEval_GetBuiltins());
    py::Ref torch = py::Ref::steal(PyImport_ImportModule("torch"));
    PyDict_SetItemString(globals.get(), "torch", torch.get());
    PyObject* r = PyRun_String(expr, Py_eval_input, globals.get(), globals.get());
    if (!r) PyErr_Print();
    return py::Ref::steal(r);
}
}  // namespace

TEST(GuardTree, ListItemTensorMatchAndMiss) {
    py::Ref list = eval("[torch.zeros(3), 5]");
    ASSERT_TRUE(list);
    GuardTree tree;
    int root = tree.add_accessor(AccessKind::Constant, -1, 0, list.get(), "xs");
    int item0 = tree.add_accessor(AccessKind::Item, root, 0, nullptr, "xs[0]");
    int item1 = tree.add_accessor(AccessKind::Item, root, 1, nullptr, "xs[1]");
    EXPECT_EQ(tree.add_accessor(AccessKind::Item, root, 0, nullptr, "xs[0]"), item0);  // reused
    Check t;
    t.kind = CheckKind::TensorMatch;
    ASSERT_TRUE(tensor_meta_of(PyList_GET_ITEM(list.get(), 0), t.tensor, false));
    tree.add_check(item0, std::move(t));
    Check eq;
    eq.kind = CheckKind::Equals;
    eq.value = py::Ref::borrow(PyList_GET_ITEM(list.get(), 1));
    tree.add_check(item1, std::move(eq));

    std::vector<PyObject*> values;
    EXPECT_TRUE(tree.check(nullptr, values));
    EXPECT_EQ(values[static_cast<size_t>(item1)], PyList_GET_ITEM(list.get(), 1));
    GuardTree::release_values(values);
    EXPECT_EQ(tree.check_verbose(nullptr), "");

    // A different size fails, and the verbose check names the dimension.
    py::Ref bigger = eval("torch.zeros(4)");
    PyList_SetItem(list.get(), 0, bigger.release());
    EXPECT_FALSE(tree.check(nullptr, values));
    GuardTree::release_values(values);
    EXPECT_EQ(tree.check_verbose(nullptr), "tensor `xs[0]` dim 0: expected 3, got 4");

    // A changed scalar fails with its old and new values.
    py::Ref same = eval("torch.zeros(3)");
    PyList_SetItem(list.get(), 0, same.release());
    PyList_SetItem(list.get(), 1, PyLong_FromLong(6));
    EXPECT_FALSE(tree.check(nullptr, values));
    GuardTree::release_values(values);
    EXPECT_EQ(tree.check_verbose(nullptr), "`xs[1]`: expected 5, got 6");
}

TEST(GuardTree, FloatEqualityIsBitwise) {
    py::Ref holder = eval("[0.0]");
    GuardTree tree;
    int root = tree.add_accessor(AccessKind::Constant, -1, 0, holder.get(), "h");
    int it = tree.add_accessor(AccessKind::Item, root, 0, nullptr, "h[0]");
    Check eq;
    eq.kind = CheckKind::Equals;
    eq.value = py::Ref::steal(PyFloat_FromDouble(0.0));
    tree.add_check(it, std::move(eq));
    std::vector<PyObject*> values;
    EXPECT_TRUE(tree.check(nullptr, values));
    GuardTree::release_values(values);
    PyList_SetItem(holder.get(), 0, PyFloat_FromDouble(-0.0));  // == 0.0, but not the same
    EXPECT_FALSE(tree.check(nullptr, values));
    GuardTree::release_values(values);
}

TEST(GuardTree, IdentityGuardDoesNotKeepObjectAlive) {
    py::Ref obj = eval("type('C', (), {})()");
    Py_ssize_t before = Py_REFCNT(obj.get());
    Check id;
    id.kind = CheckKind::IdIs;
    id.expected = py::WeakOrStrong::make(obj.get());
    EXPECT_TRUE(id.expected.is_weak());
    EXPECT_EQ(Py_REFCNT(obj.get()), before);
    EXPECT_EQ(id.expected.get(), obj.get());
    obj = py::Ref();
    EXPECT_EQ(id.expected.get(), nullptr);
}

TEST(GuardTree, DescribeSpellsChecksAsPython) {
    py::Ref list = eval("[1, 2]");
    GuardTree tree;
    int root = tree.add_accessor(AccessKind::Constant, -1, 0, list.get(), "L['xs']");
    Check len;
    len.kind = CheckKind::LenEq;
    len.length = 2;
    tree.add_check(root, std::move(len));
    auto lines = tree.describe();
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0], "len(L['xs']) == 2");
}
