// Records a known sequence with cycle_trace_recorder.h on the host (through the AscendC
// shim) and writes the profile buffer to the file named by argv[1]; see
// tests/test_device_recorder.py for the expected rows.
//
// Layout: 2 AIC slots of capacity 16, 3 AIV slots of capacity 32.
#include <cstdio>
#include <vector>

#include "cycle_trace_recorder.h"

namespace {

constexpr uint32_t kAicSlots = 2, kAivSlots = 3, kAicCapacity = 16, kAivCapacity = 32;
constexpr uint32_t kMaxCapacityB = 134217712;  // abi.MAX_CAPACITY_B, written out
static_assert(mcprof::kMaxCapacityB == kMaxCapacityB, "generation b's cap is the ABI's");

struct Ops {  // each step of a task takes a known number of cycles
    void Wait(const mcprof::TaskDesc&) { mcprof_shim::cycle += 7; }
    void Compute(const mcprof::TaskDesc& task) { mcprof_shim::cycle += 50 + task.task_type; }
    void Trigger(const mcprof::TaskDesc&) { mcprof_shim::cycle += 3; }
};

int Fail(const char* what)
{
    std::fprintf(stderr, "record_sequence: %s\n", what);
    return 1;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 2) return Fail("usage: record_sequence OUTPUT");
    const size_t size = kAicSlots * (64 + kAicCapacity * 32) + kAivSlots * (64 + kAivCapacity * 32);
    std::vector<uint8_t> buffer(size, 0);
    mcprof_shim::block_num = kAicSlots;

    // Direct records: (core, block, count). AIC 1 overflows by 4, AIV 2 by 1; AIV 1 stays idle.
    struct Plan { bool cube; uint32_t block; uint32_t records; };
    const Plan plans[] = {{true, 0, 3}, {true, 1, 20}, {false, 2, 33}};
    for (uint32_t k = 0; k < 3; ++k) {
        const Plan& plan = plans[k];
        mcprof_shim::cube = plan.cube;
        mcprof_shim::cycle = 1000 + 100 * k;
        mcprof::CycleTraceRecorder recorder;
        if (!recorder.Init(plan.block, buffer.data(), kAicCapacity, kAivCapacity)) {
            return Fail("Init refused a valid layout");
        }
        for (uint32_t i = 0; i < plan.records; ++i) {
            const uint64_t start = 2000 + 100 * k + 10 * i;
            const uint32_t desc = i % 3 == 0 ? mcprof::kDescWaitDependency
                                  : i % 3 == 1 ? 0x30001 + plan.block
                                               : mcprof::kDescTriggerEvent;
            const uint32_t owner = i % 2 == 0 ? plan.block : mcprof::kNoOwner;
            recorder.Record(desc, 100 * plan.block + i, i, owner, start, start + 5 + i);
        }
    }

    // The worker pattern on AIV 0: unprofiled it reads no clock and writes nothing.
    mcprof::TaskDesc tasks[3] = {};
    for (uint32_t i = 0; i < 3; ++i) {
        tasks[i].task_id = 40 + i;
        tasks[i].task_type = 5 + i;
        tasks[i].wait_event = i == 0 ? -1 : static_cast<int32_t>(i);
        tasks[i].trigger_event = i == 2 ? -1 : static_cast<int32_t>(i + 1);
        tasks[i].profile_desc_id = i == 2 ? 0 : 0x30002;
        tasks[i].profile_owner_id = 7;
        tasks[i].profile_task_index = i;
    }
    Ops ops;
    mcprof_shim::cube = false;
    mcprof_shim::cycle = 5000;
    mcprof::CycleTraceRecorder worker;
    if (!worker.Init(0, buffer.data(), kAicCapacity, kAivCapacity)) return Fail("Init AIV 0");
    const uint64_t reads = mcprof_shim::clock_reads;
    mcprof::RunWorker(tasks, 3, false, worker, ops);
    if (mcprof_shim::clock_reads != reads) return Fail("the unprofiled loop read the clock");
    mcprof_shim::cycle = 6000;
    mcprof::RunWorker(tasks, 3, true, worker, ops);

    // Capacities the ABI does not allow are refused, and such a recorder records nothing.
    mcprof::CycleTraceRecorder refused;
    if (refused.Init(0, buffer.data(), 24, kAivCapacity)) return Fail("accepted capacity 24");
    if (refused.Init(0, buffer.data(), kAicCapacity, 272)) return Fail("accepted capacity 272");
    if (refused.Init(0, nullptr, kAicCapacity, kAivCapacity)) return Fail("accepted no buffer");
    refused.Record(1, 2, 3, 4, 5, 6);
    if (refused.Init(0, buffer.data(), kMaxCapacityB, kAivCapacity)) {
        return Fail("generation a accepted generation b's largest capacity");
    }

    // Generation b lifts the cap: a slot of 272 records (in a buffer of its own) keeps all
    // 260 of a worker's records; its largest capacity is accepted, one step more is not.
    {
        using mcprof::AbiGeneration;
        const uint32_t wide_capacity = 272;
        std::vector<uint8_t> wide(64 + wide_capacity * 32, 0);
        mcprof_shim::cube = true;
        mcprof::CycleTraceRecorder recorder;
        if (!recorder.Init(0, wide.data(), wide_capacity, 16, 1, AbiGeneration::kB)) {
            return Fail("generation b refused capacity 272");
        }
        for (uint32_t i = 0; i < 260; ++i) recorder.Record(0x30000, i, i, 0, i, i + 1);
        const auto* header = reinterpret_cast<const mcprof::SlotHeader*>(wide.data());
        if (header->record_count != 260 || header->dropped_count != 0 ||
            header->record_capacity != wide_capacity) {
            return Fail("generation b's slot of 272 did not keep its 260 records");
        }
        mcprof::CycleTraceRecorder largest;
        if (!largest.Init(0, wide.data(), kMaxCapacityB, 16, 1, AbiGeneration::kB)) {
            return Fail("generation b refused its largest capacity");
        }
        if (largest.Init(0, wide.data(), kMaxCapacityB + 16, 16, 1, AbiGeneration::kB)) {
            return Fail("generation b accepted a capacity above its largest");
        }
    }

    std::FILE* out = std::fopen(argv[1], "wb");
    if (out == nullptr || std::fwrite(buffer.data(), 1, size, out) != size) return Fail("write");
    std::fclose(out);
    return 0;
}
