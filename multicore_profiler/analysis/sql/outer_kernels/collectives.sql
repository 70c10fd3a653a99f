-- Collectives and the compute segments between them: the macro collective_op, the views
-- collectives and segments.
-- Needs: outer_kernel_rules (the table segment_kind_rules), outer_kernels.steps.

-- The collective operation a collective kernel's name says it runs (NCCL/RCCL kernel names
-- and torch_npu's hcom_* ops: hcom_allReduce_, hcom_receive_, ...).
CREATE OR REPLACE MACRO collective_op(name) AS
CASE
    WHEN regexp_matches(name, '(?i)all_?reduce|cross_device_reduce') THEN 'all_reduce'
    WHEN regexp_matches(name, '(?i)all_?gather') THEN 'all_gather'
    WHEN regexp_matches(name, '(?i)reduce_?scatter') THEN 'reduce_scatter'
    WHEN regexp_matches(name, '(?i)all_?to_?all|dispatch|combine') THEN 'all_to_all'
    WHEN regexp_matches(name, '(?i)send_?recv') THEN 'send_recv'
    WHEN regexp_matches(name, '(?i)broadcast') THEN 'broadcast'
    WHEN regexp_matches(name, '(?i)(^|_)reduce(_|$)') THEN 'reduce'
    WHEN regexp_matches(name, '(?i)(^|_)send(_|$)') THEN 'send'
    WHEN regexp_matches(name, '(?i)(^|_)(recv|receive)(_|$)') THEN 'recv'
    ELSE 'other'
END;

-- The collective kernels of each step, in order of start: family collective, but not the
-- hardware tasks of torch_npu's communication ops (kind communication_task), which are
-- parts of the op they carry.
CREATE OR REPLACE VIEW collectives AS
SELECT source_id, rank, step_index, step_name,
    row_number() OVER (PARTITION BY source_id, step_index ORDER BY ts_ns, event_index) - 1
        AS collective_index,
    collective_op(name) AS op, name, pid, tid, stream, ts_ns, dur_ns, end_ns, event_index
FROM kernels
WHERE family = 'collective' AND kind <> 'communication_task' AND step_index IS NOT NULL;

-- The compute segments of each step: the parts of its period no collective covers (before
-- the first, between two, after the last), with the ops that start in them, the union of
-- their non-collective time (busy) and a kind from segment_kind_rules.
CREATE OR REPLACE VIEW segments AS
WITH islands AS (
    SELECT source_id, step_index, start_ns, end_ns FROM step_islands WHERE grp = 'collective'
), gaps AS (
    SELECT source_id, step_index,
        lag(end_ns) OVER (PARTITION BY source_id, step_index ORDER BY start_ns) AS gap_start,
        start_ns AS gap_end
    FROM islands
    UNION ALL
    SELECT p.source_id, p.step_index, max(i.end_ns), NULL
    FROM step_periods p LEFT JOIN islands i USING (source_id, step_index)
    GROUP BY ALL
), bounds AS (
    SELECT g.source_id, p.rank, g.step_index, p.step_name,
        coalesce(g.gap_start, p.start_ns) AS start_ns, coalesce(g.gap_end, p.end_ns) AS end_ns,
        g.gap_start IS NOT NULL AS after_collective, g.gap_end IS NOT NULL AS before_collective
    FROM gaps g JOIN step_periods p USING (source_id, step_index)
), segs AS (
    SELECT *,
        row_number() OVER (PARTITION BY source_id, step_index ORDER BY start_ns) - 1
            AS segment_index
    FROM bounds
    WHERE end_ns > start_ns
), members AS (
    SELECT s.source_id, s.step_index, s.segment_index, k.family, k.dur_ns
    FROM kernels k
    ASOF JOIN segs s
        ON k.source_id = s.source_id AND k.step_index = s.step_index AND k.ts_ns >= s.start_ns
    WHERE k.family <> 'collective' AND k.ts_ns < s.end_ns
), contents AS (
    SELECT source_id, step_index, segment_index, count(*) AS launches,
        sum(dur_ns) AS kernel_ns, list_sort(list_distinct(list(family))) AS families
    FROM members GROUP BY ALL
), kinds AS (
    SELECT m.source_id, m.step_index, m.segment_index, arg_min(r.kind, r.priority) AS kind
    FROM (SELECT DISTINCT source_id, step_index, segment_index, family FROM members) m
    JOIN segment_kind_rules r ON m.family GLOB r.family_glob
    GROUP BY ALL
), busy_spans AS (
    SELECT i.source_id, i.step_index, i.start_ns, i.end_ns,
        coalesce(first.segment_index, 0) AS first_segment, last.segment_index AS last_segment
    FROM step_islands i
    ASOF LEFT JOIN segs first
        ON i.source_id = first.source_id AND i.step_index = first.step_index
        AND i.start_ns >= first.start_ns
    ASOF JOIN segs last
        ON i.source_id = last.source_id AND i.step_index = last.step_index
        AND i.end_ns > last.start_ns
    WHERE i.grp = '~collective'
), busy AS (
    SELECT b.source_id, b.step_index, b.segment_index,
        sum(least(b.end_ns, s.end_ns) - greatest(b.start_ns, s.start_ns)) AS busy_ns
    FROM (
        SELECT source_id, step_index, start_ns, end_ns,
            unnest(generate_series(first_segment, last_segment)) AS segment_index
        FROM busy_spans
    ) b
    JOIN segs s USING (source_id, step_index, segment_index)
    WHERE b.end_ns > s.start_ns AND b.start_ns < s.end_ns
    GROUP BY ALL
)
SELECT s.source_id, s.rank, s.step_index, s.step_name, s.segment_index,
    s.start_ns, s.end_ns, s.end_ns - s.start_ns AS dur_ns,
    s.after_collective, s.before_collective,
    CASE WHEN k.kind IS NOT NULL THEN k.kind
         WHEN c.launches > 0 THEN 'compute' ELSE 'idle' END AS kind,
    coalesce(c.launches, 0) AS launches,
    coalesce(c.kernel_ns, 0)::BIGINT AS kernel_ns,
    coalesce(b.busy_ns, 0)::BIGINT AS busy_ns,
    coalesce(c.families, []) AS families
FROM segs s
LEFT JOIN contents c USING (source_id, step_index, segment_index)
LEFT JOIN kinds k USING (source_id, step_index, segment_index)
LEFT JOIN busy b USING (source_id, step_index, segment_index);
