-- Steps of the outer traces: step_periods, the kernels view (each device op with its step
-- and launch), step_islands (union intervals per step), steps and step_family_totals.
-- Needs: outer_kernel_rules (the view step_annotations), outer_kernels.device_ops.
--
-- step_periods, kernels and step_islands are tables, each built here by its statement
-- and built again in this order, after device_ops and op_launches, when the committed
-- traces change.

-- Steps with a GPU period: from the first GPU activity of the step's own launches (host
-- calls inside the annotation, on its thread) to the next step's (closed_by 'next_step').
-- The last step of a trace has no successor: under the rule last_step_rule() it ends at
-- the end of its own last device op (closed_by 'own_end'; rule 'own_end', or 'auto' in a
-- trace of one step annotation) or is left out ('drop', or 'auto' otherwise). Numbered
-- by period in each source from 0.
CREATE OR REPLACE TABLE step_periods AS
WITH annotations AS MATERIALIZED (
    -- Read once: each reference of step_annotations would scan trace_events again.
    SELECT *, count(*) OVER (PARTITION BY source_id) AS annotations FROM step_annotations
), own AS (
    SELECT a.source_id, a.event_index, min(o.ts_ns) AS start_ns, max(o.end_ns) AS own_end_ns,
        count(DISTINCT o.event_index) AS own_launches
    FROM op_launches l
    ASOF JOIN annotations a
        ON l.source_id = a.source_id AND l.launch_pid = a.pid AND l.launch_tid = a.tid
        AND l.launch_ts_ns >= a.ts_ns
    JOIN device_ops o ON o.source_id = l.source_id AND o.event_index = l.event_index
    WHERE l.launch_ts_ns <= a.ts_ns + a.dur_ns
    GROUP BY ALL
), ordered AS (
    SELECT a.*, own.start_ns, own.own_end_ns, own.own_launches,
        lead(own.start_ns) OVER w AS next_start_ns,
        row_number() OVER w - 1 AS step_index
    FROM annotations a JOIN own USING (source_id, event_index)
    WINDOW w AS (PARTITION BY a.source_id ORDER BY own.start_ns, a.ts_ns, a.event_index)
), closed AS (
    SELECT *,
        CASE WHEN next_start_ns IS NOT NULL THEN 'next_step'
             WHEN last_step_rule() = 'own_end'
                 OR (last_step_rule() = 'auto' AND annotations = 1) THEN 'own_end'
        END AS closed_by
    FROM ordered
)
SELECT
    source_id, rank, step_index, name AS step_name, step_number, phase, tokens, requests,
    details, event_index AS annotation_index, pid AS annotation_pid, tid AS annotation_tid,
    ts_ns AS annotation_ts_ns, dur_ns AS annotation_dur_ns,
    start_ns, end_ns, end_ns - start_ns AS period_ns, own_launches, closed_by
FROM (
    SELECT *, CASE closed_by WHEN 'next_step' THEN next_start_ns ELSE own_end_ns END AS end_ns
    FROM closed
)
WHERE closed_by IS NOT NULL;

-- One row per device op (kind kernel, memcpy, memset, communication or communication_task;
-- see device_ops) of every trace: its family, the step whose period it starts in (NULL
-- outside every period) and where it was launched.
CREATE OR REPLACE TABLE kernels AS
WITH first_launch AS (
    SELECT * FROM op_launches
    QUALIFY row_number() OVER (
        PARTITION BY source_id, event_index ORDER BY linked_by, launch_ts_ns) = 1
), stepped AS (
    -- The ASOF join on the op's keys alone: it sorts what it carries.
    SELECT o.source_id, o.event_index, s.step_index, s.step_name
    FROM (SELECT source_id, event_index, ts_ns FROM device_ops) o
    ASOF JOIN step_periods s ON o.source_id = s.source_id AND o.ts_ns >= s.start_ns
    WHERE o.ts_ns < s.end_ns
)
SELECT
    o.source_id, o.rank, s.step_index, s.step_name,
    o.event_index, o.kind, o.name, o.family, o.pid, o.tid, o.stream, o.device,
    o.ts_ns, o.dur_ns, o.end_ns, o.correlation, o.task_type,
    l.launch_pid, l.launch_tid, l.launch_ts_ns, l.launch_name
FROM device_ops o
LEFT JOIN first_launch l USING (source_id, event_index)
LEFT JOIN stepped s USING (source_id, event_index);

-- Islands of GPU time in each step: the union of device-op intervals clipped to the step's
-- period, per group: each family, '*' (every op) and '~collective' (every op but the
-- collectives). An op runs into every step its interval overlaps.
CREATE OR REPLACE TABLE step_islands AS
WITH periods AS (
    -- Integer keys of the steps and groups for the windows below, which sort several
    -- times slower on strings (source ids, family names).
    SELECT source_id, step_index, start_ns, end_ns,
        row_number() OVER (ORDER BY source_id, step_index) AS step_key
    FROM step_periods
), families AS (
    SELECT family, row_number() OVER (ORDER BY family) AS family_key
    FROM (SELECT DISTINCT family FROM device_ops WHERE family IS NOT NULL)
), spans AS (
    SELECT o.source_id, o.family, f.family_key, o.ts_ns, o.end_ns,
        coalesce(first.step_index, 0) AS first_step, last.step_index AS last_step
    FROM device_ops o
    LEFT JOIN families f USING (family)
    ASOF LEFT JOIN step_periods first
        ON o.source_id = first.source_id AND o.ts_ns >= first.start_ns
    ASOF JOIN step_periods last ON o.source_id = last.source_id AND o.end_ns > last.start_ns
    WHERE o.end_ns > o.ts_ns
), stepped AS (
    SELECT source_id, family, family_key, ts_ns, end_ns,
        unnest(generate_series(first_step, last_step)) AS step_index
    FROM spans
), clipped AS (
    SELECT x.source_id, x.step_index, p.step_key, x.family, x.family_key,
        greatest(x.ts_ns, p.start_ns) AS lo, least(x.end_ns, p.end_ns) AS hi
    FROM stepped x JOIN periods p USING (source_id, step_index)
), grouped AS (
    SELECT source_id, step_index, step_key,
        unnest([family, '*', CASE WHEN family <> 'collective' THEN '~collective' END]) AS grp,
        unnest([family_key, 0, -1]) AS grp_key, lo, hi
    FROM clipped
    WHERE hi > lo
), reaching AS (
    SELECT source_id, step_index, step_key, grp, grp_key, lo, hi,
        max(hi) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reached,
        max(hi) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_end
    FROM grouped
    WHERE grp IS NOT NULL
    WINDOW w AS (PARTITION BY step_key, grp_key ORDER BY lo, hi)
), opening AS (
    -- The rows that open an island: they start past the end of every row before them.
    SELECT * FROM reaching WHERE coalesce(lo > reached, true)
)
-- An island ends at what the next island's opening row has reached (the end of every row
-- before it), the last one at the end of its group. Numbered from 1; HUGEINT, the type
-- the column had as a sum of INTEGER flags.
SELECT source_id, step_index, grp, (row_number() OVER w)::HUGEINT AS island,
    lo AS start_ns, coalesce(lead(reached) OVER w, last_end) AS end_ns
FROM opening
WINDOW w AS (PARTITION BY step_key, grp_key ORDER BY lo);

-- One row per step with a GPU period: the annotation and its details, the period, the
-- device ops that start in it (launches, summed time), the union of every op's time in
-- it (busy), idle the rest of the period, and what closed the period.
CREATE OR REPLACE VIEW steps AS
WITH launched AS (
    SELECT source_id, step_index, count(*) AS launches, sum(dur_ns) AS kernel_ns
    FROM kernels WHERE step_index IS NOT NULL GROUP BY ALL
), busy AS (
    SELECT source_id, step_index, sum(end_ns - start_ns) AS busy_ns
    FROM step_islands WHERE grp = '*' GROUP BY ALL
)
SELECT p.* EXCLUDE (closed_by),
    coalesce(l.launches, 0) AS launches,
    coalesce(l.kernel_ns, 0)::BIGINT AS kernel_ns,
    coalesce(b.busy_ns, 0)::BIGINT AS busy_ns,
    (p.period_ns - coalesce(b.busy_ns, 0))::BIGINT AS idle_ns,
    p.closed_by
FROM step_periods p
LEFT JOIN launched l USING (source_id, step_index)
LEFT JOIN busy b USING (source_id, step_index);

-- Per step and kernel family: launches and summed time of the family's ops that start in
-- the step, and the union (wall) time of its ops clipped to the period, with its share.
CREATE OR REPLACE VIEW step_family_totals AS
WITH launched AS (
    SELECT source_id, step_index, family, count(*) AS launches, sum(dur_ns) AS kernel_ns
    FROM kernels WHERE step_index IS NOT NULL GROUP BY ALL
), unions AS (
    SELECT source_id, step_index, grp AS family, sum(end_ns - start_ns) AS union_ns
    FROM step_islands WHERE grp NOT IN ('*', '~collective') GROUP BY ALL
)
SELECT s.source_id, s.rank, s.step_index, s.step_name, family,
    coalesce(l.launches, 0) AS launches,
    coalesce(l.kernel_ns, 0)::BIGINT AS kernel_ns,
    coalesce(u.union_ns, 0)::BIGINT AS union_ns,
    coalesce(u.union_ns, 0) / s.period_ns AS period_share
FROM launched l
FULL JOIN unions u USING (source_id, step_index, family)
JOIN step_periods s USING (source_id, step_index);
