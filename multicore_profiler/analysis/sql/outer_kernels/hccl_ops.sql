-- Per-op communication times from torch_npu's HCCL task stream, as msprof computes the
-- communication.json of a rank: hccl_op_times ("Communication Time Info") and
-- hccl_op_bandwidth ("Communication Bandwidth Info"), over the internal view _hccl_tasks.
-- Needs: outer_kernels.device_ops (the hcom ops: kind 'communication'), outer_kernels.steps
-- (kernels, step_periods).
--
-- The trace's HCCL process holds, per communication group, a thread of its ops (named
-- "Group <name> Communication", the hcom_* events) followed by a thread per plane ("Plane
-- <id>", at the group's thread id + 1 + id) of the tasks HCCL issued for them: Notify_Wait,
-- Notify_Record, Memcpy, Reduce_Inline, RDMASend, each with its args "transport type"
-- (SDMA, RDMA, LOCAL), "link type" (ON_CHIP, HCCS, HCCS_SW, PCIE, SIO, ...) and
-- "size(Byte)". A task belongs to the last op of its group that started at or before it.
-- Level0 captures record no plane tasks.
--
-- The definitions are those of msprof's communication parser, which writes each rank's
-- communication.json (and analysis.db's CommAnalyzerTime and CommAnalyzerBandwidth) that
-- msprof-analyze's cluster analysis reads:
-- * The master plane of an op: its only plane, else plane 0 where plane 0 holds an RDMA
--   task, else plane 1. msprof reads HCCL's own master flag, which the trace does not
--   carry; this is the rule msprof used before that flag, and it names the master plane of
--   every op of the 2025 ImageNet captures (plane 1; plane 0 holds the on-chip copies).
-- * A transit task: a Memcpy or Reduce_Inline of transport SDMA whose link type is not
--   ON_CHIP (a local copy is no transfer).
-- * An RDMA payload window: a run of consecutive RDMA payload sends (args "rdma type"
--   RDMA_SEND_PAYLOAD where the trace has it, else an RDMASend of transport RDMA with no
--   notify id, 18446744073709551615: the sends that carry a notify are RDMA_SEND_NOTIFY)
--   and the k - 1 tasks after it in the plane's order (the notify sends and waits that
--   close the transfer), k = 3 for a send or receive op (its name holds "send" or
--   "receive") and 5 for the others. Its transit time runs from the first payload's start
--   to its last task's end; its size is the payloads' bytes. A window that would run past
--   the plane's last task is no window (its payloads count for nothing). The tasks inside
--   a window count only through it (a run of payloads starting inside another window,
--   which HCCL never issues, is no window).
-- * Time info: start and elapse are the op's own (its hcom event's start and duration). On
--   the master plane: transit is the summed time of the transit tasks and payload windows,
--   wait that of the Notify_Waits outside windows, synchronization that of the
--   Notify_Waits before the first transit task or window; idle = elapse - transit - wait
--   (the op's time in none of them: its launch, local copies, notify records). The wait
--   ratio wait / (wait + transit) and the synchronization ratio sync / (sync + transit)
--   are rounded to 4 places as msprof rounds them, 0 where the denominator is 0.
-- * Bandwidth info, over all planes (so an op's HCCS transit time is several times its
--   master plane's transit time): per transport type, the transit tasks by their link type
--   (HCCS_SW counts as HCCS; HCCS, PCIE and SIO as themselves; any other link as SDMA) and
--   the payload windows by their transport type (RDMA). SDMA's size and time are then
--   HCCS's + PCIE's + SIO's: the tasks counted as SDMA stay only in its size distribution.
--   Bandwidth is MB / ms (= GB/s) rounded to 4 places, 0 without time; the large packet
--   ratio is the share of packets above 32 MB (HCCS, PCIE, SIO) or 0.5 MB (RDMA), rounded
--   to 4 places, 0 for SDMA. Sizes are in bytes and MB (10^6 bytes).
--
-- Where we cannot equal msprof: times here are integer ns, each task's duration rounded to
-- the ns the trace writes in µs; msprof sums its durations in fractional ns (1/32 ns steps
-- of the device clock), so a sum may differ from its own by up to 0.5 ns per task summed
-- (at most 1 ns for an op's times and 5 ns for a bandwidth's time in the 2025 ImageNet
-- captures), and a ratio or bandwidth rounded to 4 places may differ in its last place
-- where the exact value lies that near a rounding boundary (one wait ratio and two ops'
-- bandwidths in those captures). An op with no task on its master plane (Level0 captures
-- record none; msprof refuses such an op) has NULL transit, wait, synchronization, idle
-- and ratios.

-- One row per HCCL plane task: its op (the hcom op's event_index, op_index), group, plane,
-- position in its op's plane (from 1, by start), the plane's task count, and the
-- transfer fields of its args.
CREATE OR REPLACE VIEW _hccl_tasks AS
WITH ops AS (
    SELECT source_id, pid, tid, event_index, name, ts_ns FROM device_ops
    WHERE kind = 'communication'
), threads AS (
    SELECT t.source_id, t.pid, t.tid, t.args->>'$.name' AS thread
    FROM trace_events t SEMI JOIN (SELECT DISTINCT source_id, pid FROM ops) USING (source_id, pid)
    WHERE t.ph = 'M' AND t.name = 'thread_name'
), groups AS (
    SELECT source_id, pid, tid AS group_tid, thread AS group_name FROM threads
    WHERE ends_with(thread, 'Communication')
), planes AS (
    SELECT p.source_id, p.pid, p.tid, g.group_tid, g.group_name,
        CAST(regexp_extract(p.thread, '^Plane (\d+)$', 1) AS INTEGER) AS plane_id
    FROM threads p
    ASOF JOIN groups g ON p.source_id = g.source_id AND p.pid = g.pid AND p.tid > g.group_tid
    WHERE regexp_full_match(p.thread, 'Plane \d+')
), tasks AS (
    SELECT e.source_id, e.event_index, e.pid, p.group_tid, p.group_name, p.plane_id,
        e.name AS task_type, e.ts_ns, e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns,
        coalesce(e.dur_ns, 0) AS dur_ns,
        e.args->>'$."transport type"' AS transport_type,
        e.args->>'$."link type"' AS link_type,
        coalesce(TRY_CAST(e.args->>'$."size(Byte)"' AS BIGINT), 0) AS size_bytes,
        coalesce(e.args->>'$."rdma type"' = 'RDMA_SEND_PAYLOAD',
            e.name = 'RDMASend' AND e.args->>'$."transport type"' = 'RDMA'
                AND e.args->>'$.notify_id' = '18446744073709551615') AS payload
    FROM trace_events e JOIN planes p USING (source_id, pid, tid)
    WHERE e.ph = 'X' AND e.ts_ns IS NOT NULL
)
SELECT t.*, o.event_index AS op_index, o.name AS op_name,
    CASE WHEN contains(lower(o.name), 'send') OR contains(lower(o.name), 'receive')
         THEN 3 ELSE 5 END AS window_tasks,
    t.task_type IN ('Memcpy', 'Reduce_Inline') AND t.transport_type = 'SDMA'
        AND coalesce(t.link_type <> 'ON_CHIP', true) AS transit,
    row_number() OVER w AS position,
    count(*) OVER (PARTITION BY t.source_id, o.event_index, t.plane_id) AS plane_tasks
FROM tasks t
ASOF JOIN ops o
    ON t.source_id = o.source_id AND t.pid = o.pid AND t.group_tid = o.tid AND t.ts_ns >= o.ts_ns
WINDOW w AS (PARTITION BY t.source_id, o.event_index, t.plane_id ORDER BY t.ts_ns, t.event_index);

-- The RDMA payload windows of each op and plane: the first payload's position, the
-- window's last position, its transit time (first payload's start to last task's end) and
-- size (the payloads' bytes).
CREATE OR REPLACE VIEW _hccl_payload_windows AS
WITH runs AS (
    SELECT *, sum(CASE WHEN payload AND NOT previous_payload THEN 1 ELSE 0 END) OVER w AS run
    FROM (
        SELECT *, coalesce(lag(payload) OVER w, false) AS previous_payload FROM _hccl_tasks
        WINDOW w AS (PARTITION BY source_id, op_index, plane_id ORDER BY position)
    )
    WINDOW w AS (PARTITION BY source_id, op_index, plane_id ORDER BY position)
), starts AS (
    SELECT source_id, op_index, plane_id, run,
        min(position) AS first_position, min(ts_ns) AS start_ns,
        count(*) FILTER (WHERE payload) AS payloads,
        sum(size_bytes) FILTER (WHERE payload)::BIGINT AS size_bytes,
        any_value(plane_tasks) AS plane_tasks, any_value(window_tasks) AS window_tasks,
        arg_min(transport_type, position) AS transport_type
    FROM runs WHERE run > 0 AND payload
    GROUP BY ALL
), windows AS (
    SELECT *, first_position + payloads + window_tasks - 2 AS last_position
    FROM starts
    WHERE first_position + payloads + window_tasks - 2 <= plane_tasks
    QUALIFY coalesce(first_position > lag(first_position + payloads + window_tasks - 2)
        OVER (PARTITION BY source_id, op_index, plane_id ORDER BY first_position), true)
)
SELECT w.source_id, w.op_index, w.plane_id, w.first_position, w.last_position,
    w.transport_type, w.size_bytes, t.end_ns - w.start_ns AS transit_ns
FROM windows w
JOIN _hccl_tasks t
    ON t.source_id = w.source_id AND t.op_index = w.op_index AND t.plane_id = w.plane_id
    AND t.position = w.last_position;

-- Each plane task with whether a payload window holds it (in_window) and, where one
-- starts at it, that window's transit time and size.
CREATE OR REPLACE VIEW _hccl_task_windows AS
SELECT t.*, w.transit_ns AS window_ns, w.size_bytes AS window_bytes,
    coalesce(max(w.last_position) OVER (
        PARTITION BY t.source_id, t.op_index, t.plane_id ORDER BY t.position
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) >= t.position, false) AS in_window
FROM _hccl_tasks t
LEFT JOIN _hccl_payload_windows w
    ON t.source_id = w.source_id AND t.op_index = w.op_index AND t.plane_id = w.plane_id
    AND t.position = w.first_position;

-- One row per torch_npu communication op (hcom_* event of a group thread) of every trace:
-- msprof's Communication Time Info (see the definitions above), in exact integer ns; the
-- op's event_index (as in device_ops and kernels) identifies it. A table, built here and
-- built again by this statement when the committed traces change.
CREATE OR REPLACE TABLE hccl_op_times AS
WITH masters AS (
    SELECT source_id, op_index,
        CASE WHEN count(DISTINCT plane_id) = 1 THEN min(plane_id)
             WHEN bool_or(plane_id = 0 AND transport_type = 'RDMA') THEN 0
             ELSE 1 END AS master_plane
    FROM _hccl_tasks GROUP BY ALL
), master AS (
    SELECT t.*,
        t.task_type = 'Notify_Wait' AND NOT t.in_window AS wait,
        min(CASE WHEN (t.transit AND NOT t.in_window) OR t.window_ns IS NOT NULL
                 THEN t.position END) OVER (PARTITION BY t.source_id, t.op_index)
            AS first_transfer
    FROM _hccl_task_windows t JOIN masters m USING (source_id, op_index)
    WHERE t.plane_id = m.master_plane
), times AS (
    SELECT source_id, op_index,
        coalesce(sum(dur_ns) FILTER (WHERE transit AND NOT in_window), 0)
            + coalesce(sum(window_ns), 0) AS transit_ns,
        coalesce(sum(dur_ns) FILTER (WHERE wait), 0) AS wait_ns,
        coalesce(sum(dur_ns) FILTER (
            WHERE wait AND position < coalesce(first_transfer, position + 1)), 0) AS sync_ns
    FROM master GROUP BY ALL
), ops AS (
    SELECT source_id, rank, event_index, name, ts_ns, dur_ns, tid, pid, step_index
    FROM kernels WHERE kind = 'communication'
), group_names AS (
    SELECT source_id, pid, tid, args->>'$.name' AS group_name FROM trace_events
    WHERE ph = 'M' AND name = 'thread_name'
)
SELECT o.source_id, o.rank, o.step_index, s.step_number, g.group_name,
    o.name AS op_name, o.event_index,
    o.ts_ns AS start_ns, o.dur_ns AS elapse_ns, t.transit_ns::BIGINT AS transit_ns,
    t.wait_ns::BIGINT AS wait_ns, t.sync_ns::BIGINT AS sync_ns,
    (o.dur_ns - t.transit_ns - t.wait_ns)::BIGINT AS idle_ns,
    round(CASE WHEN t.wait_ns + t.transit_ns > 0 THEN t.wait_ns / (t.wait_ns + t.transit_ns)
               WHEN t.wait_ns + t.transit_ns = 0 THEN 0 END, 4)::DOUBLE AS wait_ratio,
    round(CASE WHEN t.sync_ns + t.transit_ns > 0 THEN t.sync_ns / (t.sync_ns + t.transit_ns)
               WHEN t.sync_ns + t.transit_ns = 0 THEN 0 END, 4)::DOUBLE AS sync_ratio
FROM ops o
LEFT JOIN group_names g USING (source_id, pid, tid)
LEFT JOIN step_periods s USING (source_id, step_index)
LEFT JOIN times t ON t.source_id = o.source_id AND t.op_index = o.event_index;

-- One row per communication op with plane tasks and transport type (RDMA, HCCS, PCIE, SDMA,
-- SIO, msprof's order): msprof's Communication Bandwidth Info over all planes (see the
-- definitions above). Sizes in bytes and MB (10^6 bytes), times in ns and ms;
-- size_distribution maps a packet's bytes (msprof's key: its MB) to its packets and their
-- summed ns.
CREATE OR REPLACE VIEW hccl_op_bandwidth AS
WITH packets AS (
    SELECT source_id, op_index,
        CASE WHEN window_ns IS NOT NULL THEN transport_type
             WHEN link_type = 'HCCS_SW' THEN 'HCCS'
             WHEN link_type IN ('HCCS', 'PCIE', 'SIO') THEN link_type
             ELSE 'SDMA' END AS transport_type,
        coalesce(window_bytes, size_bytes) AS size_bytes,
        coalesce(window_ns, dur_ns) AS transit_ns
    FROM _hccl_task_windows
    WHERE (transit AND NOT in_window) OR window_ns IS NOT NULL
), sizes AS (
    SELECT source_id, op_index, transport_type, size_bytes,
        count(*) AS packets, sum(transit_ns)::BIGINT AS transit_ns
    FROM packets GROUP BY ALL
), types AS (
    SELECT source_id, op_index, transport_type,
        sum(size_bytes * packets) AS size_bytes, sum(transit_ns) AS transit_ns,
        sum(packets) AS packets,
        sum(packets) FILTER (WHERE size_bytes > CASE transport_type
            WHEN 'RDMA' THEN 500000 ELSE 32000000 END) AS large_packets,
        map(list(size_bytes ORDER BY size_bytes),
            list({'packets': packets, 'transit_ns': transit_ns} ORDER BY size_bytes))
            AS size_distribution
    FROM sizes GROUP BY ALL
), ops AS (
    SELECT DISTINCT source_id, op_index FROM _hccl_tasks
), grid AS (
    SELECT o.source_id, o.op_index, k.transport_type
    FROM ops o
    CROSS JOIN (SELECT unnest(['RDMA', 'HCCS', 'PCIE', 'SDMA', 'SIO']) AS transport_type) k
), totals AS (
    SELECT g.source_id, g.op_index, g.transport_type,
        CASE WHEN g.transport_type = 'SDMA' THEN sum(t.size_bytes) FILTER (
                WHERE t.transport_type IN ('HCCS', 'PCIE', 'SIO')) OVER op
             ELSE t.size_bytes END AS size_bytes,
        CASE WHEN g.transport_type = 'SDMA' THEN sum(t.transit_ns) FILTER (
                WHERE t.transport_type IN ('HCCS', 'PCIE', 'SIO')) OVER op
             ELSE t.transit_ns END AS transit_ns,
        CASE WHEN g.transport_type <> 'SDMA'
             THEN round(coalesce(t.large_packets, 0) / t.packets, 4) END AS large_packet_ratio,
        t.size_distribution
    FROM grid g
    LEFT JOIN types t USING (source_id, op_index, transport_type)
    WINDOW op AS (PARTITION BY g.source_id, g.op_index)
)
SELECT o.source_id, o.rank, o.step_index, o.step_number, o.group_name, o.op_name,
    o.event_index, t.transport_type,
    coalesce(t.size_bytes, 0)::BIGINT AS transit_bytes,
    coalesce(t.size_bytes, 0) / 1e6 AS transit_size_mb,
    coalesce(t.transit_ns, 0)::BIGINT AS transit_ns,
    coalesce(t.transit_ns, 0) / 1e6 AS transit_time_ms,
    coalesce(round(t.size_bytes / nullif(t.transit_ns, 0), 4), 0) AS bandwidth_gb_s,
    coalesce(t.large_packet_ratio, 0) AS large_packet_ratio,
    coalesce(t.size_distribution, MAP {}) AS size_distribution
FROM totals t
JOIN hccl_op_times o ON o.source_id = t.source_id AND o.event_index = t.op_index;
