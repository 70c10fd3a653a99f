-- Kernel-level views over the outer traces in the store (torch.profiler / kineto, torch_npu).
-- They read the rules tables kernel_family_rules, layer_sequence and segment_kind_rules,
-- the macro kernel_family(name) and the view step_annotations, which KernelRules creates.
-- Times are exact integer nanoseconds of the trace's clock.
--
-- device_ops, op_launches, step_periods, kernels and step_islands are tables: each is built
-- from its _live_ view (SELECT * FROM _live_<name>), in this order, here and again when a
-- query needs them and the committed traces have changed, so the views above them do not
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

-- Steps with a GPU period: from the first GPU activity of the step's own launches (host
-- calls inside the annotation, on its thread) to the next step's; the last step of a
-- trace has no successor and is left out. Numbered by period in each source from 0.
CREATE OR REPLACE VIEW _live_step_periods AS
WITH own AS (
    SELECT a.source_id, a.event_index, min(o.ts_ns) AS start_ns,
        count(DISTINCT o.event_index) AS own_launches
    FROM op_launches l
    ASOF JOIN step_annotations a
        ON l.source_id = a.source_id AND l.launch_pid = a.pid AND l.launch_tid = a.tid
        AND l.launch_ts_ns >= a.ts_ns
    JOIN device_ops o ON o.source_id = l.source_id AND o.event_index = l.event_index
    WHERE l.launch_ts_ns <= a.ts_ns + a.dur_ns
    GROUP BY ALL
), ordered AS (
    SELECT a.*, own.start_ns, own.own_launches,
        lead(own.start_ns) OVER w AS end_ns,
        row_number() OVER w - 1 AS step_index
    FROM step_annotations a JOIN own USING (source_id, event_index)
    WINDOW w AS (PARTITION BY a.source_id ORDER BY own.start_ns, a.ts_ns, a.event_index)
)
SELECT
    source_id, rank, step_index, name AS step_name, step_number, phase, tokens, requests,
    details, event_index AS annotation_index, pid AS annotation_pid, tid AS annotation_tid,
    ts_ns AS annotation_ts_ns, dur_ns AS annotation_dur_ns,
    start_ns, end_ns, end_ns - start_ns AS period_ns, own_launches
FROM ordered
WHERE end_ns IS NOT NULL;
CREATE OR REPLACE TABLE step_periods AS SELECT * FROM _live_step_periods;

-- One row per device op (kind kernel, memcpy or memset) of every trace: its family, the
-- step whose period it starts in (NULL outside every period) and where it was launched.
CREATE OR REPLACE VIEW _live_kernels AS
WITH first_launch AS (
    SELECT * FROM op_launches
    QUALIFY row_number() OVER (
        PARTITION BY source_id, event_index ORDER BY linked_by, launch_ts_ns) = 1
)
SELECT
    o.source_id, o.rank,
    CASE WHEN o.ts_ns < s.end_ns THEN s.step_index END AS step_index,
    CASE WHEN o.ts_ns < s.end_ns THEN s.step_name END AS step_name,
    o.event_index, o.kind, o.name, o.family, o.pid, o.tid, o.stream, o.device,
    o.ts_ns, o.dur_ns, o.end_ns, o.correlation, o.task_type,
    l.launch_pid, l.launch_tid, l.launch_ts_ns, l.launch_name
FROM device_ops o
LEFT JOIN first_launch l USING (source_id, event_index)
ASOF LEFT JOIN step_periods s ON o.source_id = s.source_id AND o.ts_ns >= s.start_ns;
CREATE OR REPLACE TABLE kernels AS SELECT * FROM _live_kernels;

-- Islands of GPU time in each step: the union of device-op intervals clipped to the step's
-- period, per group: each family, '*' (every op) and '~collective' (every op but the
-- collectives). An op runs into every step its interval overlaps.
CREATE OR REPLACE VIEW _live_step_islands AS
WITH spans AS (
    SELECT o.source_id, o.family, o.ts_ns, o.end_ns,
        coalesce(first.step_index, 0) AS first_step, last.step_index AS last_step
    FROM device_ops o
    ASOF LEFT JOIN step_periods first
        ON o.source_id = first.source_id AND o.ts_ns >= first.start_ns
    ASOF JOIN step_periods last ON o.source_id = last.source_id AND o.end_ns > last.start_ns
    WHERE o.end_ns > o.ts_ns
), stepped AS (
    SELECT source_id, family, ts_ns, end_ns,
        unnest(generate_series(first_step, last_step)) AS step_index
    FROM spans
), clipped AS (
    SELECT x.source_id, x.step_index, x.family,
        greatest(x.ts_ns, p.start_ns) AS lo, least(x.end_ns, p.end_ns) AS hi
    FROM stepped x JOIN step_periods p USING (source_id, step_index)
), grouped AS (
    SELECT source_id, step_index, unnest([family, '*',
        CASE WHEN family <> 'collective' THEN '~collective' END]) AS grp, lo, hi
    FROM clipped
    WHERE hi > lo
), flagged AS (
    SELECT *,
        coalesce(lo > max(hi) OVER (
            PARTITION BY source_id, step_index, grp ORDER BY lo, hi
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS opens
    FROM grouped
    WHERE grp IS NOT NULL
), numbered AS (
    SELECT *,
        sum(opens::INTEGER) OVER (
            PARTITION BY source_id, step_index, grp ORDER BY lo, hi ROWS UNBOUNDED PRECEDING
        ) AS island
    FROM flagged
)
SELECT source_id, step_index, grp, island, min(lo) AS start_ns, max(hi) AS end_ns
FROM numbered
GROUP BY ALL;
CREATE OR REPLACE TABLE step_islands AS SELECT * FROM _live_step_islands;

-- One row per step with a GPU period: the annotation and its details, the period, the
-- device ops that start in it (launches, summed time) and the union of every op's time
-- in it (busy); idle is the rest of the period.
CREATE OR REPLACE VIEW steps AS
WITH launched AS (
    SELECT source_id, step_index, count(*) AS launches, sum(dur_ns) AS kernel_ns
    FROM kernels WHERE step_index IS NOT NULL GROUP BY ALL
), busy AS (
    SELECT source_id, step_index, sum(end_ns - start_ns) AS busy_ns
    FROM step_islands WHERE grp = '*' GROUP BY ALL
)
SELECT p.*,
    coalesce(l.launches, 0) AS launches,
    coalesce(l.kernel_ns, 0)::BIGINT AS kernel_ns,
    coalesce(b.busy_ns, 0)::BIGINT AS busy_ns,
    (p.period_ns - coalesce(b.busy_ns, 0))::BIGINT AS idle_ns
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

-- The collective operation a collective kernel's name says it runs.
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
    WHEN regexp_matches(name, '(?i)(^|_)recv(_|$)') THEN 'recv'
    ELSE 'other'
END;

-- The collective kernels of each step, in order of start.
CREATE OR REPLACE VIEW collectives AS
SELECT source_id, rank, step_index, step_name,
    row_number() OVER (PARTITION BY source_id, step_index ORDER BY ts_ns, event_index) - 1
        AS collective_index,
    collective_op(name) AS op, name, pid, tid, stream, ts_ns, dur_ns, end_ns, event_index
FROM kernels
WHERE family = 'collective' AND step_index IS NOT NULL;

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

-- Per layer of each step and position of layer_sequence: the launches placed there. A
-- layer starts at each launch of the sequence's first family; in a layer, the n-th
-- launch of a family takes the n-th position holding that family (later ones its last).
CREATE OR REPLACE VIEW layer_stages AS
WITH seq AS (
    SELECT position, family,
        row_number() OVER (PARTITION BY family ORDER BY position) AS occurrence,
        count(*) OVER (PARTITION BY family) AS occurrences
    FROM layer_sequence
), opened AS (
    SELECT k.*,
        sum((k.family = (SELECT family FROM layer_sequence ORDER BY position LIMIT 1))::INTEGER)
            OVER (PARTITION BY source_id, step_index ORDER BY ts_ns, event_index
                  ROWS UNBOUNDED PRECEDING) AS layer
    FROM kernels k
    WHERE k.step_index IS NOT NULL AND k.family IN (SELECT family FROM layer_sequence)
), counted AS (
    SELECT *,
        row_number() OVER (
            PARTITION BY source_id, step_index, layer, family ORDER BY ts_ns, event_index) AS nth
    FROM opened
    WHERE layer > 0
), placed AS (
    SELECT c.*, s.position
    FROM counted c
    JOIN seq s ON s.family = c.family AND s.occurrence = least(c.nth, s.occurrences)
)
SELECT source_id, rank, step_index, step_name, (layer - 1)::BIGINT AS layer_index, position,
    family,
    count(*) AS launches, min(ts_ns) AS start_ns, max(end_ns) AS end_ns,
    sum(dur_ns)::BIGINT AS kernel_ns
FROM placed
GROUP BY ALL;

-- One row per layer of each step: its span (first start to last end), its launches, whether
-- every position of the sequence has a launch, and its tail: the end of the last position
-- minus the end of the one before (by default: expert down after expert gate/up).
CREATE OR REPLACE VIEW layer_spans AS
WITH sequence AS (
    SELECT max(position) AS last, count(*) AS positions FROM layer_sequence
)
SELECT source_id, rank, step_index, step_name, layer_index,
    min(start_ns) AS start_ns, max(end_ns) AS end_ns, max(end_ns) - min(start_ns) AS span_ns,
    sum(launches)::BIGINT AS launches, sum(kernel_ns)::BIGINT AS kernel_ns,
    count(*) = any_value(q.positions) AS complete,
    max(end_ns) FILTER (WHERE position = q.last)
        - max(end_ns) FILTER (WHERE position = q.last - 1) AS tail_ns
FROM layer_stages, sequence q
GROUP BY source_id, rank, step_index, step_name, layer_index;

-- Every ordered pair of traces, step by step: steps pair by index and annotation name.
-- Skews are b minus a: start (meaningful when both traces share a clock), period, the
-- summed time of the step's collectives, and the time each side's collectives waited for
-- the other's (collectives pair by index and op; a side waits from its start to the
-- other's).
CREATE OR REPLACE VIEW step_pairs AS
WITH per_step AS (
    SELECT s.source_id, s.rank, src.label, src.first_ts_ns, src.last_ts_ns,
        s.step_index, s.step_name, s.start_ns, s.period_ns,
        count(c.event_index) AS collectives, coalesce(sum(c.dur_ns), 0)::BIGINT AS collective_ns
    FROM step_periods s
    JOIN trace_sources src USING (source_id)
    LEFT JOIN collectives c USING (source_id, step_index)
    GROUP BY ALL
), waits AS (
    SELECT a.source_id AS a_source_id, b.source_id AS b_source_id, a.step_index,
        count(*) AS paired_collectives,
        sum(greatest(b.ts_ns - a.ts_ns, 0))::BIGINT AS a_wait_ns,
        sum(greatest(a.ts_ns - b.ts_ns, 0))::BIGINT AS b_wait_ns
    FROM collectives a
    JOIN collectives b
        ON a.step_index = b.step_index AND a.collective_index = b.collective_index
        AND a.op = b.op AND a.step_name = b.step_name AND a.source_id <> b.source_id
    GROUP BY ALL
)
SELECT a.label AS a_label, a.source_id AS a_source_id, a.rank AS a_rank,
    b.label AS b_label, b.source_id AS b_source_id, b.rank AS b_rank,
    a.first_ts_ns < b.last_ts_ns AND b.first_ts_ns < a.last_ts_ns AS overlapping,
    a.step_index, a.step_name,
    a.start_ns AS a_start_ns, b.start_ns AS b_start_ns, b.start_ns - a.start_ns AS start_skew_ns,
    a.period_ns AS a_period_ns, b.period_ns AS b_period_ns,
    b.period_ns - a.period_ns AS period_skew_ns,
    a.collectives AS a_collectives, b.collectives AS b_collectives,
    a.collective_ns AS a_collective_ns, b.collective_ns AS b_collective_ns,
    b.collective_ns - a.collective_ns AS collective_skew_ns,
    coalesce(w.paired_collectives, 0) AS paired_collectives,
    coalesce(w.a_wait_ns, 0) AS a_wait_ns, coalesce(w.b_wait_ns, 0) AS b_wait_ns,
    coalesce(w.b_wait_ns, 0) - coalesce(w.a_wait_ns, 0) AS wait_skew_ns
FROM per_step a
JOIN per_step b
    ON a.step_index = b.step_index AND a.step_name = b.step_name AND a.source_id <> b.source_id
LEFT JOIN waits w
    ON w.a_source_id = a.source_id AND w.b_source_id = b.source_id
    AND w.step_index = a.step_index;

-- The steps of two traces paired (see step_pairs): rank_pair('<source a>', '<source b>').
CREATE OR REPLACE MACRO rank_pair(a, b) AS TABLE
SELECT * FROM step_pairs WHERE a_source_id = a AND b_source_id = b;

-- Pairs of ranks of one job, step by step: traces with the same label (or both without
-- one) whose time ranges overlap (two runs of a job, one after the other, do not pair), the
-- lower rank as a.
CREATE OR REPLACE VIEW rank_pairs AS
SELECT * FROM step_pairs
WHERE a_label IS NOT DISTINCT FROM b_label AND a_rank < b_rank AND overlapping;
