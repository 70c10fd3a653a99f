-- Pairs of traces (ranks) step by step: step_pairs, the table macro rank_pair, rank_pairs.
-- Needs: outer_kernels.steps, outer_kernels.collectives. Reads the store's trace_sources.

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
