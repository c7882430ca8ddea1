// Kernel profiler units: attribution of records to graphs (FakeProfiler, through the same code
// as CUPTI's records), and the process's real profiler on a machine without a GPU.
#include <gtest/gtest.h>

#include "profile/profiler.h"

#include <algorithm>
#include <map>

using namespace magpy;

namespace {

// Device records (not the API records) by name -> graph id.
std::map<std::string, uint64_t> device_graphs(const std::vector<KernelRecord>& records) {
    std::map<std::string, uint64_t> out;
    for (const KernelRecord& r : records)
        if (r.kind != ActivityKind::Runtime) out[r.name] = r.graph_id;
    return out;
}

const KernelRecord* find(const std::vector<KernelRecord>& records, uint32_t correlation,
                         ActivityKind kind) {
    for (const KernelRecord& r : records)
        if (r.correlation_id == correlation && r.kind == kind) return &r;
    return nullptr;
}

}  // namespace

TEST(Profiler, KindNames) {
    EXPECT_STREQ(activity_kind_name(ActivityKind::Kernel), "kernel");
    EXPECT_STREQ(activity_kind_name(ActivityKind::Memcpy), "memcpy");
    EXPECT_STREQ(activity_kind_name(ActivityKind::Memset), "memset");
    EXPECT_STREQ(activity_kind_name(ActivityKind::Runtime), "runtime");
}

TEST(Profiler, FakeAttributesSequentialGraphs) {
    FakeProfiler p;
    ASSERT_TRUE(p.available());
    EXPECT_EQ(p.name(), "fake");
    p.start();
    ASSERT_TRUE(p.running());
    p.launch("before", ActivityKind::Kernel, 10, 20);
    p.begin_graph(1);
    uint32_t a = p.launch("g1_mm", ActivityKind::Kernel, 100, 150);
    p.launch("g1_copy", ActivityKind::Memcpy, 150, 160, 4096);
    p.end_graph(1);
    p.begin_graph(2);
    p.launch("g2_zero", ActivityKind::Memset, 200, 210, 512);
    p.end_graph(2);
    p.launch("after", ActivityKind::Kernel, 300, 310);
    std::vector<KernelRecord> records = p.flush();

    EXPECT_EQ(records.size(), 10u);  // an API record and a device record per launch
    std::map<std::string, uint64_t> graphs = device_graphs(records);
    EXPECT_EQ(graphs["before"], 0u);
    EXPECT_EQ(graphs["g1_mm"], 1u);
    EXPECT_EQ(graphs["g1_copy"], 1u);
    EXPECT_EQ(graphs["g2_zero"], 2u);
    EXPECT_EQ(graphs["after"], 0u);

    // The API call that launched g1_mm shares its correlation id and its graph.
    const KernelRecord* api = find(records, a, ActivityKind::Runtime);
    const KernelRecord* kernel = find(records, a, ActivityKind::Kernel);
    ASSERT_TRUE(api && kernel);
    EXPECT_EQ(api->graph_id, 1u);
    EXPECT_EQ(kernel->start_ns, 100);
    EXPECT_EQ(kernel->end_ns, 150);
    EXPECT_EQ(kernel->stream, 7u);
    const KernelRecord* copy = nullptr;
    for (const KernelRecord& r : records)
        if (r.name == "g1_copy") copy = &r;
    ASSERT_TRUE(copy);
    EXPECT_EQ(copy->kind, ActivityKind::Memcpy);
    EXPECT_EQ(copy->bytes, 4096u);
    EXPECT_EQ(p.unbalanced_ends(), 0u);
    EXPECT_TRUE(p.flush().empty());  // flushed records are gone
}

TEST(Profiler, FakeInnermostNestedGraphOwnsTheLaunch) {
    FakeProfiler p;
    p.start();
    p.begin_graph(10);
    p.launch("outer_first", ActivityKind::Kernel, 0, 1);
    p.begin_graph(11);
    p.launch("inner", ActivityKind::Kernel, 2, 3);
    p.begin_graph(12);
    p.launch("innermost", ActivityKind::Kernel, 4, 5);
    p.end_graph(12);
    p.end_graph(11);
    p.launch("outer_again", ActivityKind::Kernel, 6, 7);
    p.end_graph(10);
    p.launch("none", ActivityKind::Kernel, 8, 9);
    std::map<std::string, uint64_t> graphs = device_graphs(p.flush());
    EXPECT_EQ(graphs["outer_first"], 10u);
    EXPECT_EQ(graphs["inner"], 11u);
    EXPECT_EQ(graphs["innermost"], 12u);
    EXPECT_EQ(graphs["outer_again"], 10u);
    EXPECT_EQ(graphs["none"], 0u);
    EXPECT_EQ(p.open_graphs(), 0u);
    EXPECT_EQ(p.unbalanced_ends(), 0u);
}

TEST(Profiler, FakeKernelCompletingAfterTheFlushKeepsItsGraph) {
    FakeProfiler p;
    p.start();
    p.begin_graph(5);
    uint32_t c = p.launch("slow", ActivityKind::Kernel, 0, 1000, 0, 7, /*complete_later=*/true);
    p.end_graph(5);
    std::vector<KernelRecord> first = p.flush();  // the launch and its link, not the kernel
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first[0].kind, ActivityKind::Runtime);
    EXPECT_EQ(first[0].graph_id, 5u);
    p.complete_held();
    std::vector<KernelRecord> second = p.flush();
    const KernelRecord* kernel = find(second, c, ActivityKind::Kernel);
    ASSERT_TRUE(kernel);
    EXPECT_EQ(kernel->graph_id, 5u);
}

TEST(Profiler, FakeRecordsNothingWhileStoppedAndCountsDrops) {
    FakeProfiler p;
    p.begin_graph(1);  // not running: nothing is opened
    EXPECT_EQ(p.open_graphs(), 0u);
    EXPECT_EQ(p.launch("ignored", ActivityKind::Kernel, 0, 1), 0u);
    p.end_graph(1);  // never started: nothing to close, not counted
    EXPECT_EQ(p.unbalanced_ends(), 0u);
    EXPECT_TRUE(p.flush().empty());

    p.start();
    p.start();  // idempotent
    p.begin_graph(3);
    p.stop();
    EXPECT_FALSE(p.running());
    EXPECT_EQ(p.launch("stopped", ActivityKind::Kernel, 0, 1), 0u);
    p.end_graph(3);  // after stop(): still closes what was opened while running
    EXPECT_EQ(p.open_graphs(), 0u);
    EXPECT_EQ(p.unbalanced_ends(), 0u);

    p.start();
    p.launch("again", ActivityKind::Runtime, 0, 1);
    p.drop(3);
    EXPECT_EQ(p.flush().size(), 1u);
    EXPECT_EQ(p.dropped(), 3u);
}

TEST(Profiler, FakeCountsUnbalancedEnds) {
    FakeProfiler p;
    p.start();
    p.begin_graph(1);
    p.begin_graph(2);
    p.end_graph(1);  // closes 2, the innermost
    EXPECT_EQ(p.unbalanced_ends(), 1u);
    p.end_graph(1);
    p.end_graph(1);  // nothing open
    EXPECT_EQ(p.unbalanced_ends(), 2u);
    EXPECT_EQ(p.open_graphs(), 0u);
}

TEST(Profiler, FakeUnavailableIsANoOp) {
    FakeProfiler p(/*available=*/false);
    EXPECT_FALSE(p.available());
    EXPECT_NE(p.status().find("no GPU"), std::string::npos);
    p.start();
    EXPECT_FALSE(p.running());
    p.begin_graph(1);
    EXPECT_EQ(p.launch("k", ActivityKind::Kernel, 0, 1), 0u);
    p.end_graph(1);
    p.stop();
    EXPECT_TRUE(p.flush().empty());
    EXPECT_EQ(p.unbalanced_ends(), 0u);
}

TEST(Profiler, CorrelationMapForgetsTheOldest) {
    CorrelationMap map(/*capacity=*/2);
    ActivityBatch batch;
    batch.links = {{1, 100}, {2, 200}, {3, 300}};
    KernelRecord r;
    for (uint32_t c : {1u, 2u, 3u, 4u}) {
        r.correlation_id = c;
        batch.records.push_back(r);
    }
    map.attribute(batch);
    EXPECT_EQ(map.size(), 2u);
    EXPECT_EQ(batch.records[0].graph_id, 0u);  // forgotten
    EXPECT_EQ(batch.records[1].graph_id, 200u);
    EXPECT_EQ(batch.records[2].graph_id, 300u);
    EXPECT_EQ(batch.records[3].graph_id, 0u);  // never linked
}

// This machine has no GPU (CI for the CPU build): the process's profiler must say so once and
// ignore everything else. On a GPU machine the same calls must simply work.
TEST(Profiler, RealProfilerWithoutAGpuSaysSoAndDoesNothing) {
    Profiler& p = profiler();
    EXPECT_EQ(&p, &profiler());
    const std::string& status = p.status();
    EXPECT_FALSE(status.empty());
    EXPECT_EQ(status.find('\n'), std::string::npos);
#ifdef MAGPY_HAS_CUPTI
    EXPECT_EQ(p.name(), "cupti");
    EXPECT_EQ(status.rfind("CUPTI ", 0), 0u) << status;
#else
    EXPECT_EQ(p.name(), "null");
    EXPECT_NE(status.find("CUPTI not built"), std::string::npos) << status;
#endif
    if (p.available()) GTEST_SKIP() << "a GPU is present: " << status;
#ifdef MAGPY_HAS_CUPTI
    EXPECT_NE(status.find("no GPU"), std::string::npos) << status;
#endif
    for (int i = 0; i < 3; ++i) {
        p.start();
        EXPECT_FALSE(p.running());
        p.begin_graph(1);
        p.begin_graph(2);
        p.end_graph(2);
        p.end_graph(1);
        p.stop();
        EXPECT_TRUE(p.flush().empty());
    }
    EXPECT_EQ(p.unbalanced_ends(), 0u);
    EXPECT_EQ(p.dropped(), 0u);
    EXPECT_EQ(&p.status(), &status);  // said once, never changes
}
