-- Outer-kernel device ops and where they were launched: device_ops, op_launches.
-- Needs: outer_kernel_rules (the macro kernel_family). Reads the store's trace_events.
--
-- Times are exact integer nanoseconds of the trace's clock. device_ops and op_launches are
-- tables, each built here from its _live_ view and rebuilt (SELECT * FROM _live_<name>,
-- in this order) when the committed traces change, so the views above them do not
-- recompute them (DuckDB inlines a view at every reference).

-- Device activity: kernels, memcpys and memsets (kineto) and device tasks (torch_npu's,
-- which carry a Task Type), with their family.
CREATE OR REPLACE VIEW _live_device_ops AS
WITH ops AS (
    SELECT
        source_id, rank, event_index,
        CASE cat WHEN 'gpu_memcpy' THEN 'memcpy' WHEN 'gpu_memset' THEN 'memset'
                 ELSE 'kernel' END AS kind,
        name, pid, tid, stream, device, ts_ns, coalesce(dur_ns, 0) AS dur_ns,
        ts_ns + coalesce(dur_ns, 0) AS end_ns, correlation, task_type
    FROM trace_events
    WHERE ph = 'X' AND ts_ns IS NOT NULL AND is_device_op(cat, task_type)
), families AS (
    SELECT name, kernel_family(name) AS family FROM (SELECT DISTINCT name FROM ops)
)
SELECT ops.*, families.family FROM ops LEFT JOIN families USING (name);
CREATE OR REPLACE TABLE device_ops AS SELECT * FROM _live_device_ops;

-- Where each device op was launched: the host calls with its correlation id (kineto),
-- else the starts of the flows that end on the op (torch_npu's async_npu and HostToDevice
-- flows). One row per link.
CREATE OR REPLACE VIEW _live_op_launches AS
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
CREATE OR REPLACE TABLE op_launches AS SELECT * FROM _live_op_launches;
