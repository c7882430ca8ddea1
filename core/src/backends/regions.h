// Regions: the stretches of a plan that are pure tensor computation, which compiling backends
// (torchscript, fx / inductor / cudagraphs) replace by one call each. A backend makes a Python
// callable from each region's sub-plan; rewrite_regions puts the calls in the plan.
#pragma once

#include "replay/plan.h"

#include <functional>
#include <vector>

namespace magpy {

// A region of fewer graph ops stays with the plan: a graph call costs about one op's overhead.
constexpr size_t kMinGraphOps = 2;

struct Span {
    size_t begin = 0, end = 0;  // steps [begin, end) of the plan
};

// Maximal stretches of pure ops and helpers whose results that are used later are all
// tensors, of at least kMinGraphOps graph ops each.
std::vector<Span> find_regions(const Plan& plan);

// One region as a plan of its own: its steps on fresh slots, reading `inputs` inputs (the
// values it reads from before it, and tensor constants); its result is the tuple of the
// tensors used after it, then those nothing uses (a graph must still compute them: an op that
// would raise must raise).
struct RegionPlan {
    Plan sub;
    size_t inputs = 0;
    size_t outputs = 0;  // used after the region (the tuple's first items)
    size_t graph_ops = 0;
    size_t steps = 0;
};

// The plan with each span replaced by a call of make(region) (a Python callable taking the
// region's inputs and returning the tuple), which renders and raises like a recorded op.
// Null when make returns null (with a Python error set).
std::shared_ptr<Plan> rewrite_regions(const Plan& plan, const std::vector<Span>& spans,
                                      const std::function<py::Ref(RegionPlan)>& make);

// The Python callable a rewritten plan calls for `region` (`def` names it and calls it
// through its capsule, named `capsule_name`), or null with a Python error. The capsule that
// owns `region` goes to `owners` (the region is deleted here if none could be made).
template <typename R>
py::Ref region_callable(R* region, const char* capsule_name, PyMethodDef* def,
                        std::vector<py::Ref>& owners) {
    py::Ref capsule = py::Ref::steal(PyCapsule_New(region, capsule_name, [](PyObject* c) {
        delete static_cast<R*>(PyCapsule_GetPointer(c, PyCapsule_GetName(c)));
    }));
    if (!capsule) {
        delete region;
        return {};
    }
    py::Ref fn = py::Ref::steal(PyCFunction_New(def, capsule.get()));
    if (fn) owners.push_back(capsule);
    return fn;
}

// What a region's callable raises when its steps, run one by one, declined (Plan::run returned
// NULL with no error): the outer plan, whose step is inside the user's try, declines too.
void raise_region_declined();

}  // namespace magpy
