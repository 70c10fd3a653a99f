// Cycle trace recorder: the device half of multicore_profiler's MegaKernel profiling.
//
// Each AIC or AIV worker of a MegaKernel writes the spans it runs into its own slot of
// the profile buffer, in the layout of docs/device-abi.md (ABI v1, the layout of
// mindspore-ai/hyper-parallel's MegaKernel profiling): a 64-byte slot header, then up to
// `capacity` records of 32 bytes. One writer per slot, so no atomics: a record is written
// first and the slot's record_count raised after it; a full slot writes nothing and only
// counts dropped_count. The host plans the layout, zeroes the buffer, and decodes it with
// multicore_profiler.ingest.decode.
//
// For AscendC. The host test compiles it with g++ through a shim that defines the AscendC
// names used here (tests/device/kernel_operator.h). The kernel is launched with one block
// per AIC slot (GetBlockNum() AIC slots), unless Init is told otherwise.
#pragma once

#include <cstdint>

#include "kernel_operator.h"

namespace mcprof {

constexpr uint32_t kCoreAic = 1;
constexpr uint32_t kCoreAiv = 2;
constexpr uint32_t kDescWaitDependency = 0x10000;
constexpr uint32_t kDescTerminateTask = 0x10006;
constexpr uint32_t kDescTriggerEvent = 0x10007;
constexpr uint32_t kDescComputeFallback = 0x20000;  // + task type, for a task with no stage
constexpr uint32_t kNoOwner = 0xFFFFFFFFu;
constexpr uint32_t kCapacityQuantum = 16;
constexpr uint32_t kMaxCapacity = 256;  // generation a's cap
// Generation b's: the most records whose slot (64 + capacity x 32 bytes) fits 32 bits.
constexpr uint32_t kMaxCapacityB = (0xFFFFFFFFu - 64u) / 32u / kCapacityQuantum * kCapacityQuantum;

// The ABI generation of the buffer, as the RuntimeConfig header's abi_generation names it:
// a (hyper-parallel's first, at most 256 records a slot) or b (its newer one, no such cap).
enum class AbiGeneration : uint32_t { kA = 0, kB = 1 };

struct SlotHeader {
    uint64_t entry_cycle;
    uint32_t record_count;
    uint32_t dropped_count;
    uint32_t core_type;
    uint32_t block_id;
    uint32_t record_capacity;
    uint32_t reserved;
    uint64_t padding[4];
};

struct TraceRecord {
    uint64_t start_cycle;
    uint64_t end_cycle;
    uint32_t desc_id;
    uint32_t task_id;
    uint32_t stage_task_index;
    uint32_t owner_id;
};

static_assert(sizeof(SlotHeader) == 64, "the ABI's slot header is 64 bytes");
static_assert(sizeof(TraceRecord) == 32, "the ABI's record is 32 bytes");

// One task descriptor, as multicore_profiler.kernels.runtime.TASK_DTYPE lays it out: the
// kernel's own fields, then the tail the profile spec fills in.
struct TaskDesc {
    uint32_t task_id;
    uint32_t task_type;
    uint32_t core_type;
    uint32_t worker;
    uint32_t tiling_position;
    uint32_t input_position;
    int32_t wait_event;  // -1: waits on nothing
    uint32_t wait_count;
    int32_t trigger_event;  // -1: triggers nothing
    uint32_t args[4];
    uint32_t profile_desc_id;  // 0: no stage, record kDescComputeFallback + task_type
    uint32_t profile_owner_id;
    uint32_t profile_task_index;
};

static_assert(sizeof(TaskDesc) == 64, "TASK_DTYPE is 64 bytes");

class CycleTraceRecorder {
public:
    // The cycle counter shared by all cores, read after the pipes drain.
    __aicore__ static inline uint64_t Now()
    {
        AscendC::PipeBarrier<PIPE_ALL>();
        return static_cast<uint64_t>(AscendC::GetSystemCycle());
    }

    // Take this worker's slot: AIC slot `worker_id` on a cube core, AIV slot `worker_id` on
    // a vector core (whose slots follow the `aic_slots` AIC ones), and write its header.
    // Returns false, and records nothing, for a capacity that is not a multiple of 16 or
    // is above the generation's cap (256 for a, kMaxCapacityB for b), or for no buffer.
    __aicore__ inline bool Init(
        uint32_t worker_id,
        GM_ADDR profile_buffer,
        uint32_t aic_capacity,
        uint32_t aiv_capacity,
        uint32_t aic_slots = AscendC::GetBlockNum(),
        AbiGeneration generation = AbiGeneration::kA)
    {
        enabled_ = false;
        if (profile_buffer == nullptr || !ValidCapacity(aic_capacity, generation) ||
            !ValidCapacity(aiv_capacity, generation)) {
            return false;
        }
        const bool cube = ASCEND_IS_AIC;
        const uint64_t aic_stride = sizeof(SlotHeader) + uint64_t{aic_capacity} * sizeof(TraceRecord);
        const uint64_t aiv_stride = sizeof(SlotHeader) + uint64_t{aiv_capacity} * sizeof(TraceRecord);
        const uint64_t offset = cube ? worker_id * aic_stride
                                     : aic_slots * aic_stride + worker_id * aiv_stride;
        header_ = reinterpret_cast<__gm__ SlotHeader*>(profile_buffer + offset);
        records_ = reinterpret_cast<__gm__ TraceRecord*>(profile_buffer + offset + sizeof(SlotHeader));
        capacity_ = cube ? aic_capacity : aiv_capacity;
        count_ = 0;
        dropped_ = 0;
        header_->entry_cycle = Now();
        header_->record_count = 0;
        header_->dropped_count = 0;
        header_->core_type = cube ? kCoreAic : kCoreAiv;
        header_->block_id = worker_id;
        header_->record_capacity = capacity_;
        header_->reserved = 0;
        for (uint32_t i = 0; i < 4; ++i) {
            header_->padding[i] = 0;
        }
        Flush(header_);
        enabled_ = true;
        return true;
    }

    // Append one span; on a full slot, only count it as dropped.
    __aicore__ inline void Record(
        uint32_t desc,
        uint32_t task,
        uint32_t stage_index,
        uint32_t owner,
        uint64_t start,
        uint64_t end)
    {
        if (!enabled_) {
            return;
        }
        if (count_ >= capacity_) {
            header_->dropped_count = ++dropped_;
            Flush(header_);
            return;
        }
        __gm__ TraceRecord* record = records_ + count_;
        record->start_cycle = start;
        record->end_cycle = end;
        record->desc_id = desc;
        record->task_id = task;
        record->stage_task_index = stage_index;
        record->owner_id = owner;
        Flush(record);
        header_->record_count = ++count_;  // after the record: a reader never sees half of one
        Flush(header_);
    }

private:
    __aicore__ static inline bool ValidCapacity(uint32_t capacity, AbiGeneration generation)
    {
        const uint32_t cap = generation == AbiGeneration::kA ? kMaxCapacity : kMaxCapacityB;
        return capacity % kCapacityQuantum == 0 && capacity <= cap;
    }

    // Write a cache line back to global memory, so the host sees it.
    template <typename T>
    __aicore__ static inline void Flush(__gm__ T* address)
    {
        AscendC::GlobalTensor<uint64_t> line;
        line.SetGlobalBuffer(reinterpret_cast<__gm__ uint64_t*>(address));
        AscendC::DataCacheCleanAndInvalid<uint64_t, AscendC::CacheLine::SINGLE_CACHE_LINE,
                                          AscendC::DcciDst::CACHELINE_OUT>(line);
    }

    __gm__ SlotHeader* header_ = nullptr;
    __gm__ TraceRecord* records_ = nullptr;
    uint32_t capacity_ = 0;
    uint32_t count_ = 0;
    uint32_t dropped_ = 0;
    bool enabled_ = false;
};

// The worker pattern to copy. `ops` runs a task: Wait(task), Compute(task) and
// Trigger(task). The profiling flag is read once per launch: unprofiled, the loop reads no
// clock and touches no buffer; profiled, each task records its wait, its compute (its
// stage, else kDescComputeFallback + its type) and its trigger.
template <typename Ops>
__aicore__ inline void RunWorker(
    const __gm__ TaskDesc* queue, uint32_t count, bool profiling, CycleTraceRecorder& recorder,
    Ops& ops)
{
    if (!profiling) {
        for (uint32_t i = 0; i < count; ++i) {
            if (queue[i].wait_event >= 0) ops.Wait(queue[i]);
            ops.Compute(queue[i]);
            if (queue[i].trigger_event >= 0) ops.Trigger(queue[i]);
        }
        return;
    }
    for (uint32_t i = 0; i < count; ++i) {
        const __gm__ TaskDesc& task = queue[i];
        const uint32_t index = task.profile_task_index;
        const uint32_t owner = task.profile_owner_id;
        if (task.wait_event >= 0) {
            const uint64_t start = CycleTraceRecorder::Now();
            ops.Wait(task);
            recorder.Record(
                kDescWaitDependency, task.task_id, index, owner, start, CycleTraceRecorder::Now());
        }
        const uint32_t desc = task.profile_desc_id != 0 ? task.profile_desc_id
                                                        : kDescComputeFallback + task.task_type;
        uint64_t start = CycleTraceRecorder::Now();
        ops.Compute(task);
        recorder.Record(desc, task.task_id, index, owner, start, CycleTraceRecorder::Now());
        if (task.trigger_event >= 0) {
            start = CycleTraceRecorder::Now();
            ops.Trigger(task);
            recorder.Record(
                kDescTriggerEvent, task.task_id, index, owner, start, CycleTraceRecorder::Now());
        }
    }
}

}  // namespace mcprof
