-- The cross-rank view of MegaKernel invocations: the same invocation on every rank of a
-- job side by side, how far the slowest rank lags the median one, and which stage of its
-- critical path makes it lag.
-- Needs: records.critical_path (critical_path_summary).
--
-- A job is a run: every rank of a job records into one run_id (ingest/session.py), so
-- job_id = run_id. Cycle counters of different ranks are not comparable: ranks are
-- compared by durations only.
--
-- Definitions, used by every view below:
-- - invocation_order: an invocation's position, from 0, among its rank's invocations of the
--   same step, by anchor cycle (its start on the rank's counter: the smallest entry cycle of
--   a core that recorded), then invocation id, then write id. The invocations of a job's
--   ranks with the same step, order, kernel name and direction are one invocation of the
--   job, and are compared; at an order where the ranks ran different kernels (or
--   directions) each kernel is compared over its own ranks.
-- - makespan_ns: critical_path's (and core_breakdown's): from the invocation's earliest
--   record start to its latest record end, a difference of rounded ns points.
-- - median: the lower median (_rank_median, quantile_disc(x, 0.5)): of n values sorted
--   ascending, the ceil(n/2)-th; of 4 ranks the 2nd smallest, of 2 the smaller. It is one
--   rank's own value, so every excess over it is whole ns and 0 on the median rank.
-- - slowest rank (_slowest_rank): the rank of the largest value, ties to the lowest rank.

-- The lower median of a group's values (see above).
CREATE OR REPLACE MACRO _rank_median(ns) AS quantile_disc(ns, 0.5);

-- How far a group's largest value lies above its median: the time recoverable were every
-- rank as fast as the median one.
CREATE OR REPLACE MACRO _over_median(ns) AS max(ns) - _rank_median(ns);

-- The rank of a group's largest value, ties to the lowest rank.
CREATE OR REPLACE MACRO _slowest_rank(rank, ns) AS arg_max(rank, (ns, -rank::BIGINT));

-- One row per invocation: its job, step, invocation_order and rank, kernel name,
-- direction and ids. (Reads invocations only: cheap, for callers that need the alignment
-- alone, as kernel_rank_gaps does.)
CREATE OR REPLACE VIEW kernel_rank_order AS
SELECT
    run_id AS job_id, step,
    (row_number() OVER (
        PARTITION BY run_id, step, rank ORDER BY anchor_cycle, invocation_id, write_id
    ) - 1)::BIGINT AS invocation_order,
    rank, kernel_name, direction, invocation_id, write_id
FROM invocations;

-- One row per invocation: its job, step, order and rank, its makespan, the share of the
-- makespan each kind of critical_path piece takes (compute, trigger, control, wait,
-- data_wait, core_wait, front_gap: they add up to 1; 0 where the kind is not on the path)
-- and its top stage, the stage whose pieces (of every kind) take the most of the path
-- (ties: the first stage name; gaps have no stage), with that time (top_stage_ns).
CREATE OR REPLACE VIEW kernel_rank_invocations AS
WITH summary AS MATERIALIZED (
    SELECT run_id, rank, invocation_id, write_id, stage, kind, dur_ns, makespan_ns
    FROM critical_path_summary
),
kinds AS (
    SELECT
        run_id, rank, invocation_id, write_id,
        any_value(makespan_ns) AS makespan_ns,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'compute'), 0) / any_value(makespan_ns)
            AS compute_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'trigger'), 0) / any_value(makespan_ns)
            AS trigger_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'control'), 0) / any_value(makespan_ns)
            AS control_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'wait'), 0) / any_value(makespan_ns)
            AS wait_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'data_wait'), 0) / any_value(makespan_ns)
            AS data_wait_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'core_wait'), 0) / any_value(makespan_ns)
            AS core_wait_share,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'front_gap'), 0) / any_value(makespan_ns)
            AS front_gap_share
    FROM summary
    GROUP BY run_id, rank, invocation_id, write_id
),
stages AS (
    SELECT run_id, rank, invocation_id, write_id, stage, sum(dur_ns)::BIGINT AS stage_ns
    FROM summary
    WHERE stage IS NOT NULL
    GROUP BY ALL
),
top AS (
    SELECT
        run_id, rank, invocation_id, write_id,
        first(stage ORDER BY stage_ns DESC, stage) AS top_stage,
        max(stage_ns) AS top_stage_ns
    FROM stages
    GROUP BY ALL
)
SELECT
    o.job_id, o.step, o.invocation_order, o.rank, o.kernel_name, o.direction,
    o.invocation_id, o.write_id, k.makespan_ns, k.compute_share, k.trigger_share,
    k.control_share, k.wait_share, k.data_wait_share, k.core_wait_share, k.front_gap_share,
    t.top_stage, t.top_stage_ns
FROM kernel_rank_order o
JOIN kinds k
    ON k.run_id = o.job_id AND k.rank = o.rank AND k.invocation_id = o.invocation_id
    AND k.write_id = o.write_id
LEFT JOIN top t
    ON t.run_id = o.job_id AND t.rank = o.rank AND t.invocation_id = o.invocation_id
    AND t.write_id = o.write_id;

-- One row per invocation of a job (job_id, step, invocation_order, kernel_name,
-- direction) over the ranks that ran it (ranks: how many; a rank without it is absent,
-- see kernel_rank_gaps): the largest, median and smallest makespan, spread_ns = max -
-- median, the slowest rank, and recoverable_ns = max - median, the time the job's
-- invocation would take less if every rank ran it in the median rank's time (where the
-- ranks wait for the slowest after it, at a collective).
CREATE OR REPLACE VIEW kernel_rank_spread AS
SELECT
    job_id, step, invocation_order, kernel_name, direction,
    count(*) AS ranks,
    max(makespan_ns) AS max_ns,
    _rank_median(makespan_ns) AS median_ns,
    min(makespan_ns) AS min_ns,
    _over_median(makespan_ns) AS spread_ns,
    _slowest_rank(rank, makespan_ns) AS slowest_rank,
    _over_median(makespan_ns) AS recoverable_ns
FROM kernel_rank_invocations
GROUP BY ALL;

-- One row per step of a job: each rank's step_ns, the sum of the makespans of its
-- invocations in the step (a rank that lacks some of them sums fewer; see
-- kernel_rank_gaps), over the ranks that ran the step: the largest, median and smallest,
-- the slowest rank and its excess_ns over the median rank (max - median);
-- recoverable_ns is the sum of kernel_rank_spread's recoverable_ns over the step's
-- invocations: the time the step would take less if, at every invocation, every rank ran
-- in that invocation's median time. (Both from one reading of kernel_rank_invocations:
-- each reading walks every critical path.)
CREATE OR REPLACE VIEW kernel_rank_steps AS
WITH made AS MATERIALIZED (
    SELECT job_id, step, invocation_order, kernel_name, direction, rank, makespan_ns
    FROM kernel_rank_invocations
),
totals AS (
    SELECT job_id, step, rank, sum(makespan_ns)::BIGINT AS step_ns
    FROM made
    GROUP BY ALL
),
over_ranks AS (
    SELECT
        job_id, step,
        count(*) AS ranks,
        max(step_ns) AS max_ns,
        _rank_median(step_ns) AS median_ns,
        min(step_ns) AS min_ns,
        _slowest_rank(rank, step_ns) AS slowest_rank,
        _over_median(step_ns) AS excess_ns
    FROM totals
    GROUP BY ALL
),
spread AS (
    SELECT job_id, step, _over_median(makespan_ns) AS recoverable_ns
    FROM made
    GROUP BY job_id, step, invocation_order, kernel_name, direction
),
recoverable AS (
    SELECT job_id, step, sum(recoverable_ns)::BIGINT AS recoverable_ns
    FROM spread
    GROUP BY ALL
)
SELECT r.*, v.recoverable_ns
FROM over_ranks r
JOIN recoverable v ON v.job_id = r.job_id AND v.step = r.step;

-- One row per stage on the critical path of any rank of a job's invocation (job_id, step,
-- invocation_order, kernel_name, direction) that two ranks or more ran: the slowest
-- rank's critical-path time of the stage (slow_ns: its critical_path_summary rows of the
-- stage, every kind, added up; stage NULL: the path's gaps, core_wait and front_gap),
-- the median of the same time over the other ranks (median_other_ns; a rank whose path
-- lacks the stage counts 0), and excess_ns = slow_ns - median_other_ns. excess_rank
-- numbers the stages from 1, largest excess first (ties: by stage name, gaps last): the
-- stage ranked 1 is what makes the slowest rank slow.
CREATE OR REPLACE VIEW kernel_slow_rank_stages AS
WITH times AS MATERIALIZED (
    SELECT
        o.job_id, o.step, o.invocation_order, o.kernel_name, o.direction, o.rank, s.stage,
        sum(s.dur_ns)::BIGINT AS stage_ns, any_value(s.makespan_ns) AS makespan_ns
    FROM kernel_rank_order o
    JOIN critical_path_summary s
        ON s.run_id = o.job_id AND s.rank = o.rank AND s.invocation_id = o.invocation_id
        AND s.write_id = o.write_id
    GROUP BY ALL
),
spans AS (
    SELECT
        job_id, step, invocation_order, kernel_name, direction, rank,
        any_value(makespan_ns) AS makespan_ns
    FROM times
    GROUP BY ALL
),
slowest AS (
    SELECT
        job_id, step, invocation_order, kernel_name, direction,
        count(*) AS ranks, _slowest_rank(rank, makespan_ns) AS slowest_rank
    FROM spans
    GROUP BY ALL
    HAVING count(*) >= 2
),
stages AS (
    SELECT DISTINCT job_id, step, invocation_order, kernel_name, direction, stage FROM times
),
compared AS (
    SELECT
        g.job_id, g.step, g.invocation_order, g.kernel_name, g.direction, w.ranks,
        w.slowest_rank, g.stage,
        coalesce(any_value(t.stage_ns) FILTER (WHERE r.rank = w.slowest_rank), 0) AS slow_ns,
        _rank_median(CASE WHEN r.rank <> w.slowest_rank THEN coalesce(t.stage_ns, 0) END)
            AS median_other_ns
    FROM stages g
    JOIN slowest w
        ON w.job_id = g.job_id AND w.step = g.step AND w.invocation_order = g.invocation_order
        AND w.kernel_name IS NOT DISTINCT FROM g.kernel_name
        AND w.direction IS NOT DISTINCT FROM g.direction
    JOIN spans r
        ON r.job_id = g.job_id AND r.step = g.step AND r.invocation_order = g.invocation_order
        AND r.kernel_name IS NOT DISTINCT FROM g.kernel_name
        AND r.direction IS NOT DISTINCT FROM g.direction
    LEFT JOIN times t
        ON t.job_id = g.job_id AND t.step = g.step AND t.invocation_order = g.invocation_order
        AND t.kernel_name IS NOT DISTINCT FROM g.kernel_name
        AND t.direction IS NOT DISTINCT FROM g.direction
        AND t.rank = r.rank AND t.stage IS NOT DISTINCT FROM g.stage
    GROUP BY ALL
)
SELECT
    *,
    slow_ns - median_other_ns AS excess_ns,
    row_number() OVER (
        PARTITION BY job_id, step, invocation_order, kernel_name, direction
        ORDER BY slow_ns - median_other_ns DESC, stage NULLS LAST
    ) AS excess_rank
FROM compared;

-- One row per invocation of a job (job_id, step, invocation_order, kernel_name,
-- direction) that some of the job's ranks lack: missing_ranks, ascending. The job's ranks
-- are those with any invocation in the job; a rank that lacks a whole step is missing
-- from every invocation of it. Those ranks are absent from kernel_rank_spread's row
-- (ranks counts the others), so callers can warn.
CREATE OR REPLACE VIEW kernel_rank_gaps AS
WITH aligned AS (
    SELECT DISTINCT job_id, step, invocation_order, kernel_name, direction
    FROM kernel_rank_order
),
job_ranks AS (
    SELECT DISTINCT job_id, rank FROM kernel_rank_order
)
SELECT
    i.job_id, i.step, i.invocation_order, i.kernel_name, i.direction,
    list(j.rank ORDER BY j.rank) AS missing_ranks
FROM aligned i
JOIN job_ranks j ON j.job_id = i.job_id
ANTI JOIN kernel_rank_order o
    ON o.job_id = i.job_id AND o.step = i.step AND o.invocation_order = i.invocation_order
    AND o.kernel_name IS NOT DISTINCT FROM i.kernel_name
    AND o.direction IS NOT DISTINCT FROM i.direction AND o.rank = j.rank
GROUP BY ALL;
