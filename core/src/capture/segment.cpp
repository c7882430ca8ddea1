// Graph breaks that resume, on the capture side: remembering where a capture broke (a break
// site of the root code), and ending a segment cleanly before that instruction on a later
// capture. See core/capture/NOTES.md, [Note: graph breaks that resume].
#include "capture/break_reasons.h"
#include "capture/monitor.h"
#include "hook/frame_hook.h"
#include "python/compat.h"
#include "python/torch_api.h"

#include <cstdint>
#include <map>

namespace magpy {

namespace {
PyObject* builtin(const char* name) {  // borrowed
    return PyDict_GetItemString(PyEval_GetBuiltins(), name);
}
}  // namespace

// The callable a CALL at this instruction will call (identity only), so that a site found in
// one callee (`self.blocks[3](x)`) does not stop the capture at calls of the others.
const void* Monitor::callee_at(ShadowFrame& f, const py::Instruction& ins) {
    int depth = static_cast<int>(f.stack.size());
    if ((ins.opcode == CALL || ins.opcode == PRECALL) && depth >= ins.oparg + 2) {
        PyObject* below = real_stack(f, ins.oparg + 1);
        return below ? below : real_stack(f, ins.oparg);
    }
    if (ins.opcode == CALL_FUNCTION_EX && depth >= 2 + (ins.oparg & 1))
        return real_stack(f, 1 + (ins.oparg & 1));
    return nullptr;
}

bool Monitor::at_site(ShadowFrame& f, const py::Instruction& ins) {
    if (!m_seg.sites) return false;
    const void* callee = nullptr;
    bool have_callee = false;
    for (const BreakSite& s : *m_seg.sites) {
        if (s.offset != ins.offset) continue;
        if (!have_callee) {
            callee = callee_at(f, ins);
            have_callee = true;
        }
        if (s.callee == callee) {
            m_sites_reached.push_back(s.info);  // (explain() of every wrapper lists it)
            return true;
        }
    }
    return false;
}

// Called once, when the capture stops: a break (not an engine error) in the root frame's
// current instruction, or in code it calls, becomes a site of the root code.
void Monitor::note_site() {
    if (!m_seg.sites || m_cont || m_ending || !m_cap.failed() || m_cap.internal() ||
        m_root_ins.offset < 0)
        return;
    if (m_seg.sites->size() >= kMaxBreakSites) return;
    // Too large is about the whole call, not one instruction: it stays eager; so does a
    // generator left inside its cleanup (the segment before it would hold it).
    if (!m_cap.breaks().empty() && (m_cap.breaks().front().reason_id == breaks::kTooLarge ||
                                    m_cap.breaks().front().reason_id == breaks::kGeneratorCleanup))
        return;
    for (const BreakSite& s : *m_seg.sites)
        if (s.offset == m_root_ins.offset && s.callee == m_root_callee) return;
    BreakSite site;
    site.offset = m_root_ins.offset;
    site.callee = m_root_callee;
    if (!m_cap.breaks().empty()) site.info = m_cap.breaks().front();
    m_seg.sites->push_back(std::move(site));
    m_found_site = true;
    if (m_seg.progress) m_seg.progress("break_found", 1);
}

// The capture failed at the root frame's instruction `ins` before it ran (a branch on tensor
// data, a callee with no rule): when that makes a break site, the segment ends before it in
// this capture, so the break costs one capture instead of two. False: nothing was done.
bool Monitor::break_here(ShadowFrame& f, const py::Instruction& ins) {
    if (!m_seg.sites || m_cont || m_ending || m_cap.internal() || m_cap.breaks().empty() ||
        m_cap.breaks().front().reason_id == breaks::kTooLarge ||
        m_cap.breaks().front().reason_id == breaks::kGeneratorCleanup ||
        m_seg.sites->size() >= kMaxBreakSites || m_fullgraph)
        return false;
    BreakSite site;
    site.offset = ins.offset;
    site.callee = callee_at(f, ins);
    for (const BreakSite& s : *m_seg.sites)
        if (s.offset == site.offset && s.callee == site.callee) return false;
    site.info = m_cap.retract_failure();
    m_seg.sites->push_back(std::move(site));
    end_segment(f, ins);
    stop_tracing();
    return true;
}

// The iterator `it` as a real object at replay, positioned where the capture's is: sequences
// are iterated again from their position (their iterators' __setstate__); the rest become an
// iterator over their remaining items.
int Monitor::iterator_state(int it, int depth) {
    // An iterator passed in is the real one, advanced at replay ([Note: iterators passed in]).
    if (m_cap.v(it).iter_advance >= 0) return m_cap.v(it).iter_advance;
    auto known = m_rebuilt.find(it);
    if (known != m_rebuilt.end()) return known->second;
    int made = rebuilt_iterator(it, depth);
    m_rebuilt[it] = made;
    return made;
}

int Monitor::rebuilt_iterator(int it, int depth) {
    Value& iv = m_cap.v(it);
    int pos = iv.iter_pos;
    std::vector<int> rest;
    auto call = [&](PyObject* fn, std::vector<Arg> args, const std::string& label) {
        Step s;
        s.kind = StepKind::Call;
        s.args.push_back(Arg::value(fn));
        for (Arg& a : args) s.args.push_back(std::move(a));
        return m_cap.record(std::move(s), nullptr, label, false);
    };
    auto iter_of_list = [&](const std::vector<int>& items) -> int {
        Step s;
        s.kind = StepKind::BuildList;
        for (int item : items) {
            Arg a;
            if (!m_cap.escape_arg(item, a)) return -1;
            s.args.push_back(std::move(a));
        }
        int list = m_cap.record(std::move(s), nullptr, "[...]", false);
        return call(builtin("iter"), {Arg::slot(m_cap.v(list).slot)}, iv.label);
    };
    // [Note: loops over containers at a break] A dict, a set or a list walked by reversed()
    // goes on over its own iterator, made again over the container and moved on to where the
    // loop is: the code after the break may change the container, and the loop must then see
    // it as Python's would (new values, "changed size during iteration"), not a list of the
    // items it had. A container whose size the call already changed since the loop began is
    // not rebuilt: Python's iterator would raise at its next step, a new one would not; nor is
    // one whose keys or elements changed (Python's goes on by position in the table).
    auto live = [&](int container, const char* method) -> int {
        PyObject* c = m_cap.v(container).real.get();
        py::Ref now = container_state(c);
        if (!now || !iv.iter_snapshot ||
            PyObject_RichCompareBool(now.get(), iv.iter_snapshot.get(), Py_EQ) != 1) {
            PyErr_Clear();
            return -1;
        }
        Arg src;
        if (!m_cap.escape_arg(container, src)) return -1;
        int made;
        if (method && std::string(method) == "reversed") {
            made = call(builtin("reversed"), {src}, iv.label);
        } else {
            if (method) {
                Step get;
                get.kind = StepKind::GetAttr;
                get.args.push_back(src);
                get.name = py::Ref::steal(PyUnicode_FromString(method));
                int bound = m_cap.record(std::move(get), nullptr, method, false);
                Step s;
                s.kind = StepKind::Call;
                s.args = {Arg::slot(m_cap.v(bound).slot)};
                int from = m_cap.record(std::move(s), nullptr, std::string(method) + "()", false);
                made = call(builtin("iter"), {Arg::slot(m_cap.v(from).slot)}, iv.label);
            } else {
                made = call(builtin("iter"), {src}, iv.label);
            }
        }
        if (pos > 0) {  // next(islice(it, pos, pos), None): moved on by pos items
            static PyObject* islice = [] {
                py::Ref mod = py::Ref::steal(PyImport_ImportModule("itertools"));
                PyObject* f = mod ? PyObject_GetAttrString(mod.get(), "islice") : nullptr;
                if (!f) PyErr_Clear();
                return f;  // (held for good)
            }();
            if (!islice) return -1;
            py::Ref p = py::Ref::steal(PyLong_FromLong(pos));
            int sl = call(islice, {Arg::slot(m_cap.v(made).slot), Arg::value(p.get()),
                                   Arg::value(p.get())}, "islice");
            call(builtin("next"), {Arg::slot(m_cap.v(sl).slot), Arg::value(Py_None)}, "next");
        }
        return made;
    };
    switch (iv.iter_kind) {
    case IterKind::ConstSeq:
    case IterKind::FreshSeq:
    case IterKind::InputSeq: {
        const Value& sv = m_cap.v(iv.iter_source);
        if (sv.real && (PySet_Check(sv.real.get()) || PyFrozenSet_Check(sv.real.get()))) {
            if (PySet_Check(sv.real.get()) && iv.iter_container >= 0)
                return live(iv.iter_container, nullptr);  // (a set may change after the break)
            // a set's iterator has no __setstate__ either (a review probe: a repetition
            // penalty looping over a set of seen tokens broke inside the loop): its elements,
            // constants in the order the guards hold, from where the loop is
            py::Ref order = py::Ref::steal(PySequence_Tuple(sv.real.get()));
            if (!order) {
                PyErr_Clear();
                return m_cap.internal_error("the elements of a set"), -1;
            }
            for (Py_ssize_t i = pos; i < PyTuple_GET_SIZE(order.get()); ++i)
                rest.push_back(m_cap.const_value(PyTuple_GET_ITEM(order.get(), i)));
            return iter_of_list(rest);
        }
        if (iv.iter_kind == IterKind::FreshSeq && sv.real && !PyList_CheckExact(sv.real.get()) &&
            !PyTuple_CheckExact(sv.real.get())) {
            // a ModuleList made by slicing one: its iterator has no __setstate__
            std::vector<int> items = sv.items;
            if (pos < static_cast<int>(items.size())) rest.assign(items.begin() + pos, items.end());
            return iter_of_list(rest);
        }
        Arg src;
        if (!m_cap.escape_arg(iv.iter_source, src)) return -1;
        int r = call(builtin("iter"), {src}, iv.label);
        if (pos == 0) return r;
        Step get;
        get.kind = StepKind::GetAttr;
        get.args.push_back(Arg::slot(m_cap.v(r).slot));
        get.name = py::Ref::steal(PyUnicode_FromString("__setstate__"));
        int setstate = m_cap.record(std::move(get), nullptr, "__setstate__", false);
        py::Ref p = py::Ref::steal(PyLong_FromLong(pos));
        Step s;
        s.kind = StepKind::Call;
        s.args = {Arg::slot(m_cap.v(setstate).slot), Arg::value(p.get())};
        m_cap.record(std::move(s), nullptr, "setstate", false);
        return r;
    }
    case IterKind::ModuleSeq: {
        PyObject* mods = m_cap.v(iv.iter_source).real.get();
        Py_ssize_t n = PyDict_Size(mods), i = 0, k = 0;
        PyObject *key, *mod;
        while (PyDict_Next(mods, &i, &key, &mod)) {
            if (k >= pos) {
                int m = m_cap.input_child(iv.iter_source, AccessKind::DictValueAt,
                                          static_cast<int>(k), nullptr,
                                          "[" + std::to_string(k) + "]", mod);
                if (m < 0) return -1;
                rest.push_back(m);
            }
            ++k;
        }
        m_cap.guard_len(iv.iter_source, n);
        return iter_of_list(rest);
    }
    case IterKind::OpSeq: {
        Py_ssize_t n = PyObject_Length(m_cap.v(iv.iter_source).real.get());
        if (n < 0) {
            PyErr_Clear();
            return -1;
        }
        for (Py_ssize_t i = pos; i < n; ++i) {
            py::Ref real = py::Ref::steal(
                PySequence_GetItem(m_cap.v(iv.iter_source).real.get(), i));
            if (!real) {
                PyErr_Clear();
                return -1;
            }
            int item = item_of(iv.iter_source, i, real.get());
            if (item < 0) return -1;
            rest.push_back(item);
        }
        return iter_of_list(rest);
    }
    case IterKind::Flat: {
        size_t w = static_cast<size_t>(std::max(1, iv.iter_width));
        if (iv.iter_container >= 0) return live(iv.iter_container, iv.iter_method);
        std::vector<int> items = iv.items;
        for (size_t at = static_cast<size_t>(pos) * w; at + w <= items.size(); at += w) {
            if (w == 1 && !iv.iter_rows) {
                rest.push_back(items[at]);
            } else {
                std::vector<int> part(items.begin() + static_cast<long>(at),
                                      items.begin() + static_cast<long>(at + w));
                rest.push_back(m_cap.fresh(ValueKind::FreshTuple, part, nullptr));
            }
        }
        return iter_of_list(rest);
    }
    case IterKind::Zip:
    case IterKind::Enumerate: {
        if (depth > 8) return -1;
        std::vector<int> inner = iv.items;
        std::vector<Arg> args;
        for (int sub : inner) {
            int state = iterator_state(sub, depth + 1);
            Arg a;
            if (state < 0 || !m_cap.escape_arg(state, a)) return -1;
            args.push_back(std::move(a));
        }
        if (iv.iter_kind == IterKind::Zip) return call(builtin("zip"), std::move(args), iv.label);
        // enumerate's next count, read from the real object: enumerate(it, count).
        py::Ref red = py::Ref::steal(PyObject_CallMethod(m_cap.v(it).real.get(), "__reduce__", nullptr));
        if (!red || !PyTuple_Check(red.get()) || PyTuple_GET_SIZE(red.get()) < 2) {
            PyErr_Clear();
            return -1;
        }
        PyObject* count = PyTuple_GET_ITEM(PyTuple_GET_ITEM(red.get(), 1), 1);
        args.push_back(Arg::value(count));
        return call(builtin("enumerate"), std::move(args), m_cap.v(it).label);
    }
    case IterKind::Generator:  // its frame cannot be handed over: the break stays eager
    case IterKind::Map:        // nor can a map's calls
        return -1;
    }
    return -1;
}

// The break instruction as the segment's last plan step (calls and operators), or as the
// continuation's decision (branches, FOR_ITER). `stack` is the shadow stack before it and
// becomes the stack after it. False: the instruction cannot run outside the frame.
bool Monitor::break_step(ShadowFrame& f, const py::Instruction& at, std::vector<int>& stack,
                         Continuation& c) {
    py::Instruction ins = at;
    if (ins.opcode == PRECALL) {  // 3.11: PRECALL n; CALL n. Run both as one call.
        ins.offset += 1 + py::instruction_caches(PRECALL);
        ins.opcode = ins.raw = CALL;
    }
    c.next = py::next_offset(ins);
    auto pop = [&]() {
        int v = stack.back();
        stack.pop_back();
        return v;
    };
    auto run = [&](Step s, const std::vector<int>& in, int pushes_null) {
        for (int v : in) {
            Arg a;
            if (!m_cap.escape_arg(v, a)) return false;
            s.args.push_back(std::move(a));
        }
        int out = m_cap.record(std::move(s), nullptr, "result", false);
        if (pushes_null) stack.push_back(m_cap.null_value());
        stack.push_back(out);
        return true;
    };
    Step s;
    switch (ins.opcode) {
    case CALL: {
        int n = ins.oparg;
        if (static_cast<int>(stack.size()) < n + 2) return false;
        std::vector<int> in(stack.end() - n, stack.end());
        int a = stack[stack.size() - static_cast<size_t>(n) - 2];
        int b = stack[stack.size() - static_cast<size_t>(n) - 1];
        if (a == m_cap.null_value()) {
            in.insert(in.begin(), b);
        } else {
            in.insert(in.begin(), b);
            in.insert(in.begin(), a);
        }
        stack.resize(stack.size() - static_cast<size_t>(n) - 2);
        s.kind = StepKind::Call;
        s.kwnames = py::Ref::borrow(f.kwnames);
        // A Python callee (it broke inside) runs as a compiled callable of its own.
        PyObject* callee = static_cast<PyObject*>(const_cast<void*>(callee_at(f, at)));
        if (callee && compiles_on_its_own(callee)) s.args.push_back(Arg::value(compiled_call()));
        return run(std::move(s), in, 0);
    }
    case CALL_FUNCTION_EX: {
        int kw = (ins.oparg & 1) ? pop() : -1;
        int star = pop();
        int fn = pop();
        pop();  // NULL
        s.kind = StepKind::CallEx;
        return run(std::move(s), {fn, star, kw >= 0 ? kw : m_cap.const_value(Py_None)}, 0);
    }
    case BINARY_SUBSCR: {
        int key = pop(), obj = pop();
        s.kind = StepKind::GetItem;
        return run(std::move(s), {obj, key}, 0);
    }
    case BINARY_OP: case COMPARE_OP: {
        int rhs = pop(), lhs = pop();
        s.kind = ins.opcode == BINARY_OP ? StepKind::Binary : StepKind::Compare;
        s.op = ins.oparg;
        return run(std::move(s), {lhs, rhs}, 0);
    }
    case UNARY_NEGATIVE: case UNARY_POSITIVE: case UNARY_INVERT: case UNARY_NOT:
        s.kind = StepKind::Unary;
        s.op = ins.opcode == UNARY_NEGATIVE ? 0 : ins.opcode == UNARY_POSITIVE ? 1
               : ins.opcode == UNARY_INVERT ? 2 : 3;
        return run(std::move(s), {pop()}, 0);
    case LOAD_ATTR: case LOAD_METHOD:
        // LOAD_METHOD pushes (method, self) or (NULL, attribute): the second form is the same
        // to the CALL that follows.
        s.kind = StepKind::GetAttr;
        s.name = py::Ref::borrow(py::code_name(f.code, ins.oparg));
        return run(std::move(s), {pop()}, ins.opcode == LOAD_METHOD);
    case FORMAT_VALUE: case BUILD_STRING: {  // f"{x}" of a tensor: formatted in the segment
        size_t n = ins.opcode == BUILD_STRING ? static_cast<size_t>(ins.oparg)
                                              : (ins.oparg & 0x04) ? 2 : 1;
        if (stack.size() < n) return false;
        std::vector<int> in(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
        stack.resize(stack.size() - n);
        int out = format_step(ins.opcode, ins.oparg, in, nullptr);
        if (out < 0) return false;
        stack.push_back(out);
        return true;
    }
    case GET_ITER:
        s.kind = StepKind::Call;
        s.args.push_back(Arg::value(builtin("iter")));
        return run(std::move(s), {pop()}, 0);
    case STORE_ATTR: case STORE_SUBSCR: {
        int obj = pop(), val = -1, key = -1;
        if (ins.opcode == STORE_SUBSCR) {
            key = obj;
            obj = pop();
        }
        val = pop();
        Step w;
        w.kind = ins.opcode == STORE_ATTR ? StepKind::SetAttr : StepKind::SetItem;
        if (ins.opcode == STORE_ATTR) w.name = py::Ref::borrow(py::code_name(f.code, ins.oparg));
        std::vector<int> in = ins.opcode == STORE_ATTR ? std::vector<int>{obj, val}
                                                       : std::vector<int>{obj, key, val};
        m_cap.record_effect(std::move(w), in);
        return !m_cap.failed();
    }
    case POP_JUMP_FORWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_TRUE:
    case POP_JUMP_FORWARD_IF_FALSE: case POP_JUMP_BACKWARD_IF_FALSE:
    case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NONE:
    case POP_JUMP_FORWARD_IF_NOT_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
    case JUMP_IF_TRUE_OR_POP: case JUMP_IF_FALSE_OR_POP: {
        c.kind = Continuation::Kind::Branch;
        c.jump = py::jump_target(ins);
        switch (ins.opcode) {
        case POP_JUMP_FORWARD_IF_TRUE: case POP_JUMP_BACKWARD_IF_TRUE: case JUMP_IF_TRUE_OR_POP:
            c.test = Continuation::Test::IsTrue;
            break;
        case POP_JUMP_FORWARD_IF_NONE: case POP_JUMP_BACKWARD_IF_NONE:
            c.test = Continuation::Test::IsNone;
            break;
        case POP_JUMP_FORWARD_IF_NOT_NONE: case POP_JUMP_BACKWARD_IF_NOT_NONE:
            c.test = Continuation::Test::IsNotNone;
            break;
        default:
            c.test = Continuation::Test::IsFalse;
        }
        c.pop_on_jump = ins.opcode != JUMP_IF_TRUE_OR_POP && ins.opcode != JUMP_IF_FALSE_OR_POP;
        return !stack.empty();
    }
    case FOR_ITER:
        c.kind = Continuation::Kind::ForIter;
        c.jump = py::jump_target(ins);
        return !stack.empty();
    default:
        return false;
    }
}

// [Note: callees compiled on their own] for a call that runs in the resume code: when the
// break instruction `at` is a call of Python code that broke inside (`callee`) and runs as
// plain Python after the segment (inside a try block), the callable on `stack` becomes
// functools.partial(compiled_call, callable), made by the plan. The call then runs the callee
// as a compiled callable of its own, raising into the user's handlers as the plain call
// would, instead of running all of it eagerly. `callee` is left null when it is not wrapped.
// False: the capture failed.
bool Monitor::compile_callee_on_stack(const py::Instruction& at, PyObject*& callee,
                                      std::vector<int>& stack) {
    bool call = at.opcode == CALL || at.opcode == PRECALL;
    if (!callee || !call || !compiles_on_its_own(callee)) {
        callee = nullptr;
        return true;
    }
    size_t n = static_cast<size_t>(at.oparg);
    if (stack.size() < n + 2) return m_cap.internal_error("a call's stack"), false;
    size_t method = stack.size() - n - 2;  // the function of a method call, or NULL
    size_t at_callable = stack[method] == m_cap.null_value() ? method + 1 : method;
    int callable = stack[at_callable];
    if (m_cap.v(callable).real.get() != callee) {  // not the object the site broke in
        callee = nullptr;
        return true;
    }
    Step s;
    s.kind = StepKind::Call;
    s.args.push_back(Arg::value(torch_api().functools_partial.get()));
    s.args.push_back(Arg::value(compiled_call()));
    Arg a;
    if (!m_cap.escape_arg(callable, a)) return false;
    s.args.push_back(std::move(a));
    stack[at_callable] = m_cap.record(std::move(s), nullptr, "compiled callee", false);
    return true;
}

// Ends the segment before the root frame's instruction `at` (a known break site): the plan
// gets the break instruction (when it is a call or an operator) and returns the frame's live
// state; the Continuation says how the frame goes on. On failure the capture fails with the
// site's original break, and the call is cached as eager.
void Monitor::end_segment(ShadowFrame& f, const py::Instruction& at) {
    m_ending = true;  // a failure here is this site's, not a new one
    m_cap.set_ending_segment();  // functions made in the call cannot be live at the break
    BreakInfo why;
    for (const BreakSite& s : *m_seg.sites)
        if (s.offset == at.offset) why = s.info;
    // Not resumable: the capture fails with the site's own break (reported once), the call is
    // cached as eager, and a note says why the rest did not resume.
    auto refuse = [&](std::string because) {
        if (m_cap.failed() && !m_cap.breaks().empty()) because = m_cap.breaks().back().reason;
        else m_cap.fail(breaks::kUnsupportedOpcode, because, "");
        if (!why.reason_id.empty()) m_cap.set_break(why);
        m_note = "the call runs eagerly after the break at line " + std::to_string(why.lineno) +
                 " (" + because + ")";
    };
    PyCodeObject* origin = m_seg.origin;
    if (!origin || !py::code_is_plain_function(f.code))
        return refuse("generators are not resumed");
    if (f.handlers > 0) return refuse("a break inside an except clause is not resumed");
    auto cont = std::make_shared<Continuation>();
    cont->origin = origin;
    cont->line = m_cap.line();
    std::vector<int> stack = f.stack;
    // Loops over containers go on over iterators made before the break instruction runs in
    // the plan, as Python's were made before it ([Note: loops over containers at a break]): a
    // `s.discard(2); s.add(12)` there must find an iterator that counts the set's size as it
    // was, not as the discard left it.
    m_rebuilt.clear();
    for (size_t i = 0; i < f.locals.size() + stack.size(); ++i) {
        int id = i < f.locals.size() ? f.locals[i] : stack[i - f.locals.size()];
        if (id >= 0 && id != m_cap.null_value() && m_cap.v(id).kind == ValueKind::Iterator &&
            m_cap.v(id).iter_container >= 0 && iterator_state(id) < 0)
            return refuse("an iterator over a container cannot be rebuilt");
    }
    // [Note: calls that read their caller's frame] A replay plan runs in place of the frame,
    // so a call made from it sees the frame's caller as its own: `locals()` would list the
    // caller's names, zero-argument `super()` would find no `__class__`, and logging would
    // report the caller's file and line. Such a call is not a plan step: the segment ends
    // before it, and the frame goes on from it as plain Python in its resume code, whose
    // name, lines, locals and closure are the original's. When the call's statement is
    // simple, that code is a bridge ([Note: bridges] in magpy/_resume.py): it runs the
    // statement and hands the frame's state to an ordinary resume function, so the rest of
    // the call is captured again; otherwise the rest of the call runs as plain Python.
    PyObject* callee = static_cast<PyObject*>(const_cast<void*>(callee_at(f, at)));
    size_t nargs = at.opcode == CALL_FUNCTION_EX ? SIZE_MAX : static_cast<size_t>(at.oparg);
    if (callee && reads_caller_frame(callee, nargs)) {
        cont->eager = true;
        cont->next = at.offset;
        m_note = "at the break at line " + std::to_string(cont->line) + ", `" +
                 callable_name(callee) +
                 "` runs in the function's own frame (it reads the frame that calls it); "
                 "capture goes on after its statement when that is straight-line code outside "
                 "try and with blocks, else the rest of the call runs as plain Python";
    } else if (why.reason_id == breaks::kUnsupportedCallee && py::drops_frame_reference(at.opcode)) {
        // [Note: finalizers] in monitor.cpp: the statement frees an object with a __del__.
        cont->eager = true;
        cont->next = at.offset;
        m_note = "at the break at line " + std::to_string(cont->line) + ", the statement that "
                 "frees an object with a __del__ runs in the function's own frame; capture goes "
                 "on after it when that is straight-line code outside try and with blocks";
    } else if (py::code_offset_reaches_user_handler(f.code, at.offset)) {
        // [Note: breaks inside try blocks] Made from the plan, the break instruction would
        // raise outside the frame, where the user's except or finally clause does not see it.
        // It runs in the resume code instead, inside the same handlers (the exception table is
        // the original's), and the rest of the call goes on there as plain Python.
        cont->eager = true;
        cont->next = at.offset;
        m_note = "the break at line " + std::to_string(cont->line) + " is inside a try block: "
                 "it runs in the function's own frame, where the except or finally clause "
                 "sees its exceptions, and the rest of the call runs as plain Python";
        if (!compile_callee_on_stack(at, callee, stack)) return refuse("no callee wrapper");
        if (callee)
            m_note += " (`" + callable_name(callee) + "` there is compiled on its own)";
    } else if (!break_step(f, at, stack, *cont) || m_cap.failed()) {
        return refuse("the instruction cannot run on its own");
    }
    // A call's keyword names are set by the KW_NAMES before it: the frame going on at the call
    // runs that first, or the keywords would be taken for positional arguments.
    if (cont->eager && f.kwnames && f.kwnames_at >= 0 && f.kwnames_at < at.offset)
        cont->next = f.kwnames_at;
    cont->next -= m_seg.shift;
    if (cont->jump >= 0) cont->jump -= m_seg.shift;

    // The live state: the original code's varnames, the stack, then cells that are not
    // arguments. Cell arguments carry their contents (the resume code makes the cell).
    std::vector<int> live;
    int nvar = origin->co_nlocals;
    cont->nvar = nvar;
    int none = m_cap.const_value(Py_None);
    auto cell_content = [&](int i) {
        auto it = m_cap.cells().find(py::frame_local(f.frame, i));
        return it == m_cap.cells().end() ? -1 : it->second;
    };
    // A function made in the call that escaped (stored in a list passed in, a global) holds the
    // frame's cells; the resume code would make new ones, and the two would split (a review
    // probe: `STORE.append(g)`, a break, then `k = 10` unseen by the stored g).
    for (int i = 0; i < py::code_nlocalsplus(f.code); ++i)
        if ((py::code_local_kind(f.code, i) & py::kLocalKindCell) &&
            m_cap.cell_frozen(py::frame_local(f.frame, i)))
            return refuse("a function made in the call over `" +
                          py::str_of(py::code_localsplus_name(f.code, i)) +
                          "` is held outside the frame, and the code after the break would "
                          "not share that variable with it");
    for (int i = 0; i < nvar; ++i) {
        bool is_cell = py::code_local_kind(f.code, i) & py::kLocalKindCell;
        int id = is_cell ? cell_content(i) : f.locals[static_cast<size_t>(i)];
        if (id < 0) cont->unbound.push_back(i);
        live.push_back(id < 0 ? none : id);
    }
    for (int id : stack) {
        cont->stack_nulls.push_back(id == m_cap.null_value());
        if (id == m_cap.null_value()) continue;
        if (m_cap.v(id).kind == ValueKind::Iterator) {
            id = iterator_state(id);  // (once per iterator: m_rebuilt)
            if (id < 0) return refuse("an iterator on the stack cannot be rebuilt");
        }
        live.push_back(id);
    }
    const size_t nstack_live = live.size() - static_cast<size_t>(nvar);
    int n = py::code_nlocalsplus(f.code);
    int k = 0;
    for (int i = nvar; i < n; ++i) {
        unsigned char kind = py::code_local_kind(f.code, i);
        if (!(kind & py::kLocalKindCell) || (kind & py::kLocalKindArg)) continue;
        int id = cell_content(i);
        if (id < 0) cont->unbound.push_back(origin->co_nlocals + k);
        live.push_back(id < 0 ? none : id);
        ++k;
    }
    for (int& id : live)
        if (m_cap.v(id).kind == ValueKind::Iterator) {
            id = iterator_state(id);
            if (id < 0) return refuse("an iterator in a local cannot be rebuilt");
        }
    // Inner functions are made again by the resume code, over its own cells ([Note: inner
    // functions at a break] in replay/resume.h): None holds their places, and their defaults
    // follow the cells.
    std::map<int, size_t> remade;  // value -> index in cont->functions
    std::vector<int> parts;
    for (size_t p = 0; p < live.size(); ++p) {
        const Value& v = m_cap.v(live[p]);
        if (v.kind != ValueKind::Function) continue;
        auto it = remade.find(live[p]);
        if (it == remade.end()) {
            InnerFunction fn;
            std::string why;
            if (!inner_function(v.real.get(), f.frame, f.code, origin, true, fn, why)) {
                if (!why.empty()) return refuse(why);
                continue;  // the live state's build refuses it
            }
            if (fn.defaults) parts.push_back(v.items[0]);
            if (fn.kwdefaults) parts.push_back(v.items[1]);
            it = remade.emplace(live[p], cont->functions.size()).first;
            cont->functions.push_back(std::move(fn));
        }
        cont->functions[it->second].held_at(p, static_cast<size_t>(nvar), nstack_live);
        live[p] = none;
    }
    live.insert(live.end(), parts.begin(), parts.end());
    for (int id : live) {
        const Value& v = m_cap.v(id);
        cont->computed.push_back(v.dyn_scalar || (v.kind == ValueKind::OpResult && !v.tensor));
    }
    m_live = m_cap.fresh(ValueKind::FreshTuple, live, nullptr);
    m_cap.v(m_live).label = "live state";
    Arg built;  // built here, after the break step: it is what the frame holds at this point
    if (!m_cap.escape_arg(m_live, built) || m_cap.failed())
        return refuse("its state cannot be rebuilt");
    m_cont = std::move(cont);
    if (m_seg.progress) {
        m_seg.progress("break_found", 1);
        m_seg.progress("graph_found", static_cast<long long>(m_cap.graph_op_count()));
    }
}

}  // namespace magpy
