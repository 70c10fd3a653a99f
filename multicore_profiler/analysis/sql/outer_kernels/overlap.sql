-- The breakdowns the profilers print themselves, to set beside step_time_breakdown:
-- overlap_analysis (torch_npu's own Overlap Analysis slices per step) and
-- temporal_breakdown (HTA's get_temporal_breakdown and get_comm_comp_overlap per trace).
-- Their own module, apart from breakdown.sql: creating these views binds trace_events
-- three more times, which a query of step_time_breakdown need not pay.
-- Needs: outer_kernels.breakdown (breakdown_ops), outer_kernels.steps (op_launches,
-- step_periods, step_annotations).
--
-- Unions of intervals are found as in breakdown.sql: the union of intervals sorted by
-- start is the sum of what each one reaches past the latest end before it.

-- One row per torch_npu trace and step whose trace carries msprof's own Overlap Analysis
-- process: the summed time of its Computing, Communication, Communication(Not Overlapped)
-- and Free slices inside the step's period (each slice clipped to it), to set beside
-- step_time_breakdown.
CREATE OR REPLACE VIEW overlap_analysis AS
WITH processes AS (
    SELECT DISTINCT source_id, pid FROM trace_events
    WHERE ph = 'M' AND name = 'process_name' AND args->>'$.name' = 'Overlap Analysis'
), slices AS (
    SELECT e.source_id, e.name, e.ts_ns, e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns
    FROM trace_events e SEMI JOIN processes USING (source_id, pid)
    WHERE e.ph = 'X' AND e.ts_ns IS NOT NULL
), clipped AS (
    SELECT p.source_id, p.rank, p.step_index, p.step_name, s.name,
        least(s.end_ns, p.end_ns) - greatest(s.ts_ns, p.start_ns) AS ns
    FROM slices s
    JOIN step_periods p
        ON s.source_id = p.source_id AND s.ts_ns < p.end_ns AND s.end_ns > p.start_ns
)
SELECT source_id, rank, step_index, step_name,
    coalesce(sum(ns) FILTER (WHERE name = 'Computing'), 0)::BIGINT AS computing_ns,
    coalesce(sum(ns) FILTER (WHERE name = 'Communication'), 0)::BIGINT AS communication_ns,
    coalesce(sum(ns) FILTER (WHERE name = 'Communication(Not Overlapped)'), 0)::BIGINT
        AS communication_not_overlapped_ns,
    coalesce(sum(ns) FILTER (WHERE name = 'Free'), 0)::BIGINT AS free_ns,
    count(*) AS slices
FROM clipped
GROUP BY ALL;

-- One row per trace (a rank): HTA's temporal breakdown and comm/comp overlap, over
-- breakdown_ops. HTA keeps the ops whose correlation id a host event starting before the
-- last step annotation carries (the ops launched before the last step; on torch_npu, the
-- ops a flow starting before it links to), when
-- the trace has two step annotations or more, else every device op; kernel time is from
-- the first kept op's start to the last one's end, idle the part of it outside every
-- kept op, compute the union of the compute ops, non-compute the rest of the busy time,
-- and the overlap the share of the communication union that the compute union covers
-- (NULL without communication).
CREATE OR REPLACE VIEW temporal_breakdown AS
WITH last_step AS (
    SELECT source_id, max(ts_ns) AS last_start_ns FROM step_annotations
    GROUP BY ALL HAVING count(*) > 1
), kept AS (
    SELECT o.source_id, o.rank, o.class, o.ts_ns AS lo, o.end_ns AS hi
    FROM breakdown_ops o LEFT JOIN last_step l USING (source_id)
    WHERE l.last_start_ns IS NULL
        OR EXISTS (
            SELECT 1 FROM trace_events h
            WHERE h.source_id = o.source_id AND h.correlation = o.correlation
                AND h.ph = 'X' AND is_host_event(h.cat, h.task_type)
                AND h.ts_ns < l.last_start_ns)
        OR EXISTS (
            SELECT 1 FROM op_launches k
            WHERE k.source_id = o.source_id AND k.event_index = o.event_index
                AND k.linked_by = 'flow' AND k.launch_ts_ns < l.last_start_ns)
), grouped AS (
    SELECT source_id, rank, lo, hi,
        unnest(['*', class, CASE WHEN class IN ('compute', 'communication') THEN 'busy' END])
            AS grp
    FROM kept
), reaching AS (
    SELECT *, max(hi) OVER (
        PARTITION BY source_id, grp ORDER BY lo, hi
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached
    FROM grouped
    WHERE grp IS NOT NULL
), unions AS (
    SELECT source_id, rank,
        max(hi) FILTER (WHERE grp = '*') - min(lo) FILTER (WHERE grp = '*') AS kernel_ns,
        sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = '*') AS gpu_ns,
        coalesce(sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'compute'), 0) AS compute_ns,
        coalesce(sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'communication'), 0) AS comm_ns,
        coalesce(sum(greatest(hi - greatest(lo, coalesce(reached, lo)), 0))
            FILTER (WHERE grp = 'busy'), 0) AS busy_ns
    FROM reaching
    GROUP BY ALL
)
SELECT source_id, rank,
    (kernel_ns - gpu_ns)::BIGINT AS idle_ns,
    compute_ns::BIGINT AS compute_ns,
    (gpu_ns - compute_ns)::BIGINT AS non_compute_ns,
    kernel_ns::BIGINT AS kernel_ns,
    comm_ns::BIGINT AS communication_ns,
    (compute_ns + comm_ns - busy_ns)::BIGINT AS comm_comp_overlap_ns,
    (kernel_ns - gpu_ns) / nullif(kernel_ns, 0) AS idle_share,
    compute_ns / nullif(kernel_ns, 0) AS compute_share,
    (gpu_ns - compute_ns) / nullif(kernel_ns, 0) AS non_compute_share,
    (compute_ns + comm_ns - busy_ns) / nullif(comm_ns, 0) AS comm_comp_overlap_ratio
FROM unions;
