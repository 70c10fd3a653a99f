-- Time breakdowns of the outer traces' steps: breakdown_ops (each device op with its
-- class) and step_time_breakdown (msprof-analyze's step_trace_time per step); the
-- profilers' own breakdowns are in overlap.sql.
-- Needs: outer_kernels.steps (device_ops, step_periods).
--
-- Every time is a length of a union of intervals in exact integer ns, found in SQL: the
-- union of intervals sorted by start is the sum of what each one reaches past the latest
-- end before it. An intersection is the sum of two unions less the union of both.

-- The class of a device op in a breakdown, as HTA classes kernels: 'communication' (the
-- collectives: family 'collective'), 'memory' (HTA's memcpy / memset / dma kernels,
-- kineto's gpu_memcpy and gpu_memset, and Ascend's copies: MEMCPY_ASYNC and MemcopyAsync
-- tasks and the PCIe DMA and SDMA tasks of a compute stream), 'other' (HTA's other kernels:
-- a name holding Memcpy or Sync; and Ascend's tasks that run no op: event record / wait and
-- place-holder tasks, which only synchronize streams, by their runtime type
-- device_task_type, and the tasks torch_npu names by their Task Type alone, such as the
-- "Other" tasks of HCCL's streams in its 2024 captures) and 'compute', the rest. The tests
-- are on literal prefixes and substrings, not regexes: kernel names run to hundreds of
-- characters, and a regex over each of them cost milliseconds per query.
CREATE OR REPLACE MACRO breakdown_class(name, kind, family, task_type) AS
CASE
    WHEN family = 'collective' THEN 'communication'
    WHEN kind IN ('memcpy', 'memset')
        OR starts_with(name, 'Memcpy') OR starts_with(name, 'Memset') OR starts_with(name, 'dma')
        OR name IN ('MEMCPY_ASYNC', 'MemcopyAsync')
        OR coalesce(task_type IN ('PCIE_DMA_SQE', 'SDMA_SQE', 'PCIE_DMA'), false)
        THEN 'memory'
    WHEN contains(name, 'Memcpy') OR contains(name, 'Sync')
        OR coalesce(name = task_type, false)
        OR coalesce(starts_with(device_task_type(name, task_type), 'EVENT_RECORD')
            OR starts_with(device_task_type(name, task_type), 'EVENT_WAIT')
            OR starts_with(device_task_type(name, task_type), 'PLACE_HOLDER'), false)
        THEN 'other'
    ELSE 'compute'
END;

-- Each device op with time (end after start) and its breakdown class, and kineto's
-- cuda_sync events (kind 'sync', class 'other': the device waiting on a stream, an event
-- or the context), which HTA counts as GPU time. 'receive' marks the communication ops
-- msprof-analyze counts as pipeline bubble (names hcom_receive*).
CREATE OR REPLACE VIEW breakdown_ops AS
SELECT source_id, rank, event_index, kind, name, family, task_type, stream, correlation,
    ts_ns, end_ns, breakdown_class(name, kind, family, task_type) AS class,
    family = 'collective' AND starts_with(name, 'hcom_receive') AS receive
FROM device_ops
WHERE end_ns > ts_ns
UNION ALL
SELECT source_id, rank, event_index, 'sync' AS kind, name, NULL AS family, task_type,
    stream, correlation, ts_ns, ts_ns + dur_ns AS end_ns, 'other' AS class, false AS receive
FROM trace_events
WHERE ph = 'X' AND cat = 'cuda_sync' AND ts_ns IS NOT NULL AND dur_ns > 0;

-- One row per trace and step of `steps`: msprof-analyze's step_trace_time columns, from
-- the device ops clipped to the step's period [start_ns, end_ns). Computing is the union
-- of the compute ops, Communication the union of the collectives, Communication(Not
-- Overlapped) the part of that union outside the compute union, Overlapped the rest of
-- it. The collectives are the communication ops, not the tasks HCCL issues for them (kind
-- communication_task): msprof counts an op's time, and a task of a helper stream may
-- outlast its op (a notify wait of torch_npu's 2024 captures ends up to 0.8 ms after it).
-- As in msprof's Overlap Analysis, the stage runs from the first compute or
-- communication op in the period to the end of the last (stage_start_ns, stage_end_ns);
-- Free is the part of it outside both unions (memory copies and stream synchronization
-- count as free), Bubble the union of the hcom_receive ops, Stage its length less the
-- bubble, Preparing from the step annotation's start to the stage's start (0 without a
-- stage). Shares are of Stage (NULL where Stage is 0).
CREATE OR REPLACE VIEW step_time_breakdown AS
WITH clipped AS (
    SELECT p.source_id, p.step_index, o.class, o.receive,
        greatest(o.ts_ns, p.start_ns) AS lo, least(o.end_ns, p.end_ns) AS hi
    FROM breakdown_ops o
    JOIN step_periods p
        ON o.source_id = p.source_id AND o.ts_ns < p.end_ns AND o.end_ns > p.start_ns
    WHERE o.class IN ('compute', 'communication') AND o.kind <> 'communication_task'
), grouped AS (
    SELECT source_id, step_index, lo, hi,
        unnest([class, 'busy', CASE WHEN receive THEN 'receive' END]) AS grp
    FROM clipped
), reaching AS (
    SELECT *, max(hi) OVER (
        PARTITION BY source_id, step_index, grp ORDER BY lo, hi
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM grouped
    WHERE grp IS NOT NULL
), unions AS (
    SELECT source_id, step_index,
        sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'compute') AS compute_ns,
        sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'communication') AS comm_ns,
        sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'busy') AS busy_ns,
        sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'receive') AS receive_ns,
        min(lo) FILTER (WHERE grp = 'busy') AS stage_start_ns,
        max(hi) FILTER (WHERE grp = 'busy') AS stage_end_ns
    FROM reaching
    GROUP BY ALL
), columns AS (
    SELECT p.source_id, p.rank, p.step_index, p.step_name, p.start_ns, p.end_ns,
        u.stage_start_ns, u.stage_end_ns,
        coalesce(u.stage_end_ns - u.stage_start_ns, 0) AS span_ns,
        coalesce(u.compute_ns, 0)::BIGINT AS computing_ns,
        coalesce(u.comm_ns, 0)::BIGINT AS communication_ns,
        coalesce(u.busy_ns - u.compute_ns, u.busy_ns, 0)::BIGINT
            AS communication_not_overlapped_ns,
        coalesce(u.busy_ns, 0) AS busy_ns,
        coalesce(u.receive_ns, 0)::BIGINT AS bubble_ns,
        coalesce(u.stage_start_ns - p.annotation_ts_ns, 0)::BIGINT AS preparing_ns
    FROM step_periods p
    LEFT JOIN unions u USING (source_id, step_index)
), staged AS (
    SELECT source_id, rank, step_index, step_name, start_ns, end_ns, stage_start_ns,
        stage_end_ns, computing_ns, communication_ns, communication_not_overlapped_ns,
        communication_ns - communication_not_overlapped_ns AS overlapped_ns,
        (span_ns - busy_ns)::BIGINT AS free_ns,
        (span_ns - bubble_ns)::BIGINT AS stage_ns, bubble_ns, preparing_ns
    FROM columns
)
SELECT *,
    computing_ns / nullif(stage_ns, 0) AS computing_share,
    communication_ns / nullif(stage_ns, 0) AS communication_share,
    communication_not_overlapped_ns / nullif(stage_ns, 0) AS communication_not_overlapped_share,
    overlapped_ns / nullif(stage_ns, 0) AS overlapped_share,
    free_ns / nullif(stage_ns, 0) AS free_share,
    bubble_ns / nullif(stage_ns, 0) AS bubble_share,
    preparing_ns / nullif(stage_ns, 0) AS preparing_share
FROM staged;
