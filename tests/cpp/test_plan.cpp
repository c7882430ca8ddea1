// Replay plan units: steps run in order over slots and inputs, and render as readable Python.
#include <gtest/gtest.h>

#include "python/compat.h"
#include "replay/plan.h"

using namespace magpy;

TEST(Plan, RunsStepsAndBuildsTheResult) {
    Plan plan;
    py::Ref builtins = py::Ref::borrow(PyEval_GetBuiltins());
    PyObject* abs_fn = PyDict_GetItemString(builtins.get(), "abs");
    Step add;
    add.kind = StepKind::Binary;
    add.op = NB_ADD;
    add.out = plan.add_slot();
    add.args = {Arg::input(0), Arg::input(1)};
    plan.add_step(add);
    Step call;
    call.kind = StepKind::Call;
    call.out = plan.add_slot();
    call.args = {Arg::value(abs_fn), Arg::slot(add.out)};
    plan.add_step(call);
    Step tuple;
    tuple.kind = StepKind::BuildTuple;
    tuple.out = plan.add_slot();
    tuple.args = {Arg::slot(call.out), Arg::input(0)};
    plan.add_step(tuple);
    plan.set_result(Arg::slot(tuple.out));
    plan.set_input_names({"L['a']", "L['b']"});

    py::Ref a = py::Ref::steal(PyLong_FromLong(3));
    py::Ref b = py::Ref::steal(PyLong_FromLong(-10));
    PyObject* inputs[] = {a.get(), b.get()};
    Declined declined;
    py::Ref r = py::Ref::steal(plan.run(inputs, declined));
    ASSERT_TRUE(r);
    ASSERT_TRUE(PyTuple_Check(r.get()));
    EXPECT_EQ(PyLong_AsLong(PyTuple_GET_ITEM(r.get(), 0)), 7);
    EXPECT_EQ(PyTuple_GET_ITEM(r.get(), 1), a.get());

    std::string code = plan.render("f");
    EXPECT_NE(code.find("v0 = L['a'] + L['b']"), std::string::npos) << code;
    EXPECT_NE(code.find("v1 = abs(v0)"), std::string::npos) << code;
    EXPECT_NE(code.find("return v2"), std::string::npos) << code;
}

TEST(Plan, FailingStepReturnsNullWithTheError) {
    Plan plan;
    Step div;
    div.kind = StepKind::Binary;
    div.op = NB_TRUE_DIVIDE;
    div.out = plan.add_slot();
    div.args = {Arg::input(0), Arg::input(1)};
    plan.add_step(div);
    plan.set_result(Arg::slot(div.out));
    py::Ref one = py::Ref::steal(PyLong_FromLong(1));
    py::Ref zero = py::Ref::steal(PyLong_FromLong(0));
    PyObject* inputs[] = {one.get(), zero.get()};
    Declined declined;
    PyObject* r = plan.run(inputs, declined);
    EXPECT_EQ(r, nullptr);
    EXPECT_EQ(declined, Declined::No);
    ASSERT_TRUE(PyErr_ExceptionMatches(PyExc_ZeroDivisionError));
    PyErr_Clear();
}
