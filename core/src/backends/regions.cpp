// See regions.h.
#include "backends/regions.h"

#include "guards/guard_tree.h"

#include <algorithm>

namespace magpy {

namespace {

// A tensor op that can be part of a graph: no effect, or an in-place change of a tensor the
// region itself made (checked by the caller: `t = a + b; t += c` is fine, `x += 1` on an input
// is not; see [Note: torchscript backend] for views).
// `t.data` and `p.grad` give tensors the tracer does not follow: they would be baked into the
// graph as constants (the tensors at trace time), so they stay in the plan (a review probe:
// gradients clipped by hand were clipped on the trace's copy of the gradient).
bool untraced_attribute(const Step& s) {
    return s.kind == StepKind::GetAttr && s.name &&
           (PyUnicode_CompareWithASCIIString(s.name.get(), "data") == 0 ||
            PyUnicode_CompareWithASCIIString(s.name.get(), "grad") == 0);
}

bool graph_step(const Step& s) {
    return s.graph_op && !untraced_attribute(s) && (!s.effect || s.mutates >= 0) && !s.draws &&
           s.out >= 0 && s.result_kind != 0 &&
           (s.kind == StepKind::Call || s.kind == StepKind::CallEx ||
            s.kind == StepKind::Binary || s.kind == StepKind::Unary ||
            s.kind == StepKind::Compare || s.kind == StepKind::GetItem ||
            s.kind == StepKind::GetAttr);
}

// Python glue between ops that may live inside a graph's trace as long as its result does not
// leave the region: building the list for torch.cat, picking an item of a chunk() result.
bool helper(const Step& s) {
    return !s.graph_op && !s.effect && s.out >= 0 && !untraced_attribute(s) &&
           (s.kind == StepKind::BuildList || s.kind == StepKind::BuildTuple ||
            s.kind == StepKind::BuildSlice || s.kind == StepKind::GetItem ||
            s.kind == StepKind::GetAttr);
}

}  // namespace

std::vector<Span> find_regions(const Plan& plan) {
    const std::vector<Step>& steps = plan.steps();
    const size_t n = steps.size();
    std::vector<size_t> last_use(static_cast<size_t>(plan.num_slots()), 0);
    std::vector<bool> used(static_cast<size_t>(plan.num_slots()), false);
    auto use = [&](const Arg& a, size_t at) {
        if (a.kind != Arg::Kind::Slot || a.index < 0) return;
        last_use[static_cast<size_t>(a.index)] = at;
        used[static_cast<size_t>(a.index)] = true;
    };
    for (size_t i = 0; i < n; ++i)
        for (const Arg& a : steps[i].args) use(a, i);
    use(plan.result(), n);

    std::vector<Span> out;
    std::vector<bool> made(static_cast<size_t>(plan.num_slots()), false);  // in this region
    auto fits = [&](const Step& s) {
        if (helper(s)) return true;
        if (!graph_step(s)) return false;
        if (!s.effect) return true;
        if (static_cast<size_t>(s.mutates) >= s.args.size()) return false;
        const Arg& t = s.args[static_cast<size_t>(s.mutates)];
        return t.kind == Arg::Kind::Slot && made[static_cast<size_t>(t.index)];
    };
    size_t i = 0;
    while (i < n) {
        if (!graph_step(steps[i]) || steps[i].effect) {
            ++i;
            continue;
        }
        size_t end = i;
        std::fill(made.begin(), made.end(), false);
        // A region stays inside one `with` block: a step that raises leaves through the
        // block's __exit__, which the outer plan runs ([Note: with blocks]).
        while (end < n && steps[end].ctx == steps[i].ctx && fits(steps[end]))
            made[static_cast<size_t>(steps[end++].out)] = true;
        // Cut before the first step whose result is needed after the region but is not a
        // tensor (a list, a tuple from chunk(), a torch.Size, a ModuleList made again); until
        // none is left, since a cut may leave an earlier step's user outside.
        for (bool cut = true; cut;) {
            cut = false;
            for (size_t k = i; k < end && !cut; ++k) {
                size_t slot = static_cast<size_t>(steps[k].out);
                bool escapes = used[slot] && last_use[slot] >= end;
                bool built = steps[k].kind == StepKind::BuildList ||
                             steps[k].kind == StepKind::BuildTuple ||
                             steps[k].kind == StepKind::BuildSlice;
                if (escapes && (steps[k].result_kind != 1 || built)) {
                    end = k;
                    cut = true;
                }
            }
        }
        size_t ops = 0;
        for (size_t k = i; k < end; ++k) ops += steps[k].graph_op ? 1 : 0;
        if (ops >= kMinGraphOps) out.push_back({i, end});
        i = std::max(end, i + 1);
    }
    return out;
}

namespace {

Arg remap(const Arg& a, const std::vector<int>& slot_map, std::vector<Arg>& ext) {
    if (a.kind == Arg::Kind::Slot && slot_map[static_cast<size_t>(a.index)] >= 0)
        return Arg::slot(slot_map[static_cast<size_t>(a.index)]);
    if (a.kind == Arg::Kind::Const && !is_tensor(a.constant.get())) return a;
    for (size_t i = 0; i < ext.size(); ++i) {
        const Arg& e = ext[i];
        if (e.kind == a.kind && e.index == a.index && e.constant.get() == a.constant.get())
            return Arg::input(static_cast<int>(i));
    }
    ext.push_back(a);
    return Arg::input(static_cast<int>(ext.size() - 1));
}

}  // namespace

void raise_region_declined() {
    PyErr_SetString(PyExc_RuntimeError, "magpy: a region declined (run the frame eagerly)");
}

std::shared_ptr<Plan> rewrite_regions(const Plan& plan, const std::vector<Span>& spans,
                                      const std::function<py::Ref(RegionPlan)>& make) {
    const std::vector<Step>& steps = plan.steps();
    auto rewritten = std::make_shared<Plan>(plan);
    std::vector<Step> out_steps;
    size_t next = 0;
    for (const Span& sp : spans) {
        for (; next < sp.begin; ++next) out_steps.push_back(steps[next]);
        // The sub-plan: the region's steps on fresh slots, reading the region's inputs.
        Plan sub;
        for (const SourceLocation& l : plan.locations()) sub.add_location(l);
        for (const py::Ref& f : plan.sites()) sub.add_site(f.get());
        std::vector<int> slot_map(static_cast<size_t>(plan.num_slots()), -1);
        std::vector<Arg> ext;
        size_t ops = 0;
        bool in_try = false;
        for (size_t k = sp.begin; k < sp.end; ++k) {
            Step s = steps[k];
            for (Arg& a : s.args) a = remap(a, slot_map, ext);
            int out = sub.add_slot();
            slot_map[static_cast<size_t>(steps[k].out)] = out;
            s.out = out;
            ops += s.graph_op ? 1 : 0;
            in_try = in_try || s.in_try;
            s.ctx = -1;  // the outer plan's block: the region call carries it
            sub.add_step(std::move(s));
        }
        // Outputs: results used after the region (all tensors, find_regions made sure).
        // Then results nothing uses: the graph returns them too, or the executor would drop
        // their ops, and an op that would have raised (an index out of range) must still.
        std::vector<int> outputs;  // original slots
        std::vector<int> kept;
        {
            std::vector<bool> live(static_cast<size_t>(plan.num_slots()), false);
            for (size_t k = sp.end; k < steps.size(); ++k)
                for (const Arg& a : steps[k].args)
                    if (a.kind == Arg::Kind::Slot) live[static_cast<size_t>(a.index)] = true;
            if (plan.result().kind == Arg::Kind::Slot)
                live[static_cast<size_t>(plan.result().index)] = true;
            for (size_t k = sp.begin; k < sp.end; ++k)
                if (live[static_cast<size_t>(steps[k].out)]) outputs.push_back(steps[k].out);
            for (size_t k = sp.end; k-- > sp.begin;) {
                size_t out = static_cast<size_t>(steps[k].out);
                if (!live[out] && steps[k].result_kind == 1) {
                    live[out] = true;
                    kept.push_back(steps[k].out);
                }
                if (live[out])
                    for (const Arg& a : steps[k].args)
                        if (a.kind == Arg::Kind::Slot) live[static_cast<size_t>(a.index)] = true;
            }
        }
        Step tuple;
        tuple.kind = StepKind::BuildTuple;
        for (int o : outputs) tuple.args.push_back(Arg::slot(slot_map[static_cast<size_t>(o)]));
        for (int o : kept) tuple.args.push_back(Arg::slot(slot_map[static_cast<size_t>(o)]));
        tuple.out = sub.add_slot();
        sub.set_result(Arg::slot(tuple.out));
        sub.add_step(std::move(tuple));

        RegionPlan rp;
        rp.sub = std::move(sub);
        rp.inputs = ext.size();
        rp.outputs = outputs.size();
        rp.graph_ops = ops;
        rp.steps = sp.end - sp.begin;
        py::Ref fn = make(std::move(rp));
        if (!fn) return nullptr;

        Step call;
        call.kind = StepKind::Call;
        call.args.push_back(Arg::value(fn.get()));
        for (const Arg& a : ext) call.args.push_back(a);
        call.out = rewritten->add_slot();
        call.graph_op = true;
        call.in_try = in_try;
        call.ctx = steps[sp.begin].ctx;
        call.line = steps[sp.begin].line;
        call.loc = steps[sp.begin].loc;
        call.frame_added = true;  // the region's own steps add the user's line to a traceback
        call.result_kind = 2;
        int tuple_slot = call.out;
        out_steps.push_back(std::move(call));
        for (size_t j = 0; j < outputs.size(); ++j) {
            Step pick;
            pick.kind = StepKind::GetItem;
            pick.args = {Arg::slot(tuple_slot),
                         Arg{Arg::Kind::Const, -1, py::Ref::steal(PyLong_FromSize_t(j))}};
            pick.out = outputs[j];
            pick.line = call.line;
            pick.result_kind = 1;
            out_steps.push_back(std::move(pick));
        }
        next = sp.end;
    }
    for (; next < steps.size(); ++next) out_steps.push_back(steps[next]);
    rewritten->set_steps(std::move(out_steps));
    return rewritten;
}

}  // namespace magpy
