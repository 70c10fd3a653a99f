// A host stand-in for the AscendC names cycle_trace_recorder.h uses, so that g++ can
// compile it: no address spaces, pipes that are always drained, a system cycle counter
// and a core type the test program sets, and cache flushes that have nothing to flush.
#pragma once

#include <cstdint>

#define __aicore__
#define __gm__
#define GM_ADDR uint8_t*

enum pipe_t { PIPE_ALL };

namespace mcprof_shim {
inline uint64_t cycle = 0;       // what GetSystemCycle returns
inline uint64_t clock_reads = 0;  // how often it was asked
inline uint32_t block_num = 0;   // what GetBlockNum returns
inline bool cube = true;         // whether the code runs on an AIC (else an AIV) core
}  // namespace mcprof_shim

#define ASCEND_IS_AIC (mcprof_shim::cube)
#define ASCEND_IS_AIV (!mcprof_shim::cube)

namespace AscendC {

template <pipe_t pipe>
inline void PipeBarrier() {}

inline int64_t GetSystemCycle()
{
    ++mcprof_shim::clock_reads;
    return static_cast<int64_t>(mcprof_shim::cycle);
}

inline uint32_t GetBlockNum() { return mcprof_shim::block_num; }

template <typename T>
struct GlobalTensor {
    void SetGlobalBuffer(T*) {}
};

enum class CacheLine { SINGLE_CACHE_LINE };
enum class DcciDst { CACHELINE_OUT };

template <typename T, CacheLine line, DcciDst destination>
inline void DataCacheCleanAndInvalid(GlobalTensor<T>&) {}

}  // namespace AscendC
