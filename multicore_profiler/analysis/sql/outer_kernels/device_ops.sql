-- Outer-kernel device ops and where they were launched: device_ops, op_launches.
-- Needs: outer_kernel_rules (the macro kernel_family). Reads the store's trace_events.
--
-- Times are exact integer nanoseconds of the trace's clock. device_ops and op_launches are
-- tables, each built here by its CREATE OR REPLACE TABLE statement and built again by it
-- (in this order) when the committed traces change, so the views above them do not
-- recompute them (DuckDB inlines a view at every reference).

-- The runtime type of a torch_npu device task: its Task Type, or its name where the Task
-- Type is the generic "Other" ("other"). Older captures (torch_npu of 2024) give every task
-- that type, and name a runtime task by its type, an upper-case identifier (NOTIFY_WAIT,
-- EVENT_RECORD, MEMCPY_ASYNC, REDUCE_ASYNC_V2), and a kernel by its op (trans_Cast_10,
-- ReduceSum47), which keeps the type "Other".
CREATE OR REPLACE MACRO device_task_type(name, task_type) AS
CASE WHEN lower(task_type) = 'other' AND regexp_full_match(name, '[A-Z][A-Z0-9_]*') THEN name
     ELSE task_type END;

-- Whether a torch_npu device task is part of a collective's transfer: its runtime type
-- (device_task_type) is one HCCL issues (notify waits and records, value writes, SDMA / RDMA
-- transfers, memory copies, inline and asynchronous reductions), in its Ascend Hardware form
-- or the _SQE one.
CREATE OR REPLACE MACRO is_communication_task(task_type) AS
coalesce(regexp_matches(upper(replace(task_type, ' ', '_')),
    '^(NOTIFY_WAIT|NOTIFY_RECORD|WRITE_VALUE|SDMA|RDMA|MEMCPY_ASYNC|REDUCE_INLINE'
    || '|REDUCE_ASYNC(_V2)?)(_SQE)?$'), false);

-- Device activity: kernels, memcpys and memsets (kineto) and device tasks (torch_npu's,
-- which carry a Task Type), with their family; and torch_npu's communication ops, the
-- hcom_* events of its HCCL process (kind 'communication', family 'collective').
-- The tasks HCCL issues for them (is_communication_task) on a communication stream (one
-- holding a notify task, so never a compute stream's SDMA memcpys) are their parts: kind
-- 'communication_task', family 'collective'.
CREATE OR REPLACE TABLE device_ops AS
WITH hccl AS (
    SELECT DISTINCT source_id, pid, true AS is_hccl FROM trace_events
    WHERE ph = 'M' AND name = 'process_name' AND args->>'$.name' = 'HCCL'
), events AS (
    SELECT
        e.source_id, e.rank, e.event_index,
        CASE WHEN NOT is_device_op(e.cat, e.task_type) THEN 'communication'
             WHEN e.cat = 'gpu_memcpy' THEN 'memcpy' WHEN e.cat = 'gpu_memset' THEN 'memset'
             ELSE 'kernel' END AS kind,
        e.name, e.pid, e.tid, e.stream, e.device, e.ts_ns, coalesce(e.dur_ns, 0) AS dur_ns,
        e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns, e.correlation, e.task_type
    FROM trace_events e
    LEFT JOIN hccl h ON e.source_id = h.source_id AND e.pid = h.pid
    WHERE e.ph = 'X' AND e.ts_ns IS NOT NULL AND (is_device_op(e.cat, e.task_type)
        OR (h.is_hccl AND starts_with(e.name, 'hcom_')))
), communication_streams AS (
    SELECT DISTINCT source_id, pid, tid FROM events
    WHERE regexp_matches(upper(device_task_type(name, task_type)),
        '^NOTIFY[ _](WAIT|RECORD)(_SQE)?$')
), ops AS (
    SELECT t.* REPLACE (
        CASE WHEN is_communication_task(device_task_type(t.name, t.task_type))
            AND c.tid IS NOT NULL
             THEN 'communication_task' ELSE t.kind END AS kind)
    FROM events t LEFT JOIN communication_streams c USING (source_id, pid, tid)
), families AS (
    -- The names of events, not of ops: ops is then read once, and not materialized.
    SELECT name, kernel_family(name) AS family FROM (SELECT DISTINCT name FROM events)
)
SELECT ops.*,
    CASE WHEN ops.kind IN ('communication', 'communication_task') THEN 'collective'
         ELSE families.family END AS family
FROM ops LEFT JOIN families USING (name);

-- Where each device op was launched: the host calls with its correlation id (kineto),
-- else the starts of the flows that end on the op (torch_npu's async_npu and HostToDevice
-- flows). One row per link.
CREATE OR REPLACE TABLE op_launches AS
WITH host_calls AS (
    SELECT source_id, correlation, pid, tid, ts_ns, name
    FROM trace_events
    WHERE ph = 'X' AND correlation IS NOT NULL AND is_host_event(cat, task_type)
), by_correlation AS (
    SELECT o.source_id, o.event_index, h.pid AS launch_pid, h.tid AS launch_tid,
        h.ts_ns AS launch_ts_ns, h.name AS launch_name, 'correlation' AS linked_by
    FROM device_ops o JOIN host_calls h USING (source_id, correlation)
), unlinked AS (
    SELECT * FROM device_ops ANTI JOIN by_correlation USING (source_id, event_index)
), flow_ends AS (
    -- Only on the tracks of ops still unlinked: none in a kineto trace.
    SELECT source_id, cat, flow_id, pid, tid, ts_ns FROM trace_events
    SEMI JOIN (SELECT DISTINCT source_id, pid, tid FROM unlinked) USING (source_id, pid, tid)
    WHERE ph = 'f' AND flow_id IS NOT NULL AND ts_ns IS NOT NULL
), flow_starts AS (
    SELECT source_id, cat, flow_id, pid, tid, ts_ns, name FROM trace_events
    WHERE ph = 's' AND flow_id IS NOT NULL AND ts_ns IS NOT NULL
), by_flow AS (
    SELECT o.source_id, o.event_index, s.pid AS launch_pid, s.tid AS launch_tid,
        s.ts_ns AS launch_ts_ns, s.name AS launch_name, 'flow' AS linked_by
    FROM flow_ends f
    ASOF JOIN unlinked o
        ON f.source_id = o.source_id AND f.pid = o.pid AND f.tid = o.tid AND f.ts_ns >= o.ts_ns
    JOIN flow_starts s
        ON s.source_id = f.source_id AND s.flow_id = f.flow_id AND s.cat IS NOT DISTINCT FROM f.cat
    WHERE f.ts_ns <= o.end_ns
)
SELECT * FROM by_correlation UNION ALL SELECT * FROM by_flow;
