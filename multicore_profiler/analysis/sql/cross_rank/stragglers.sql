-- Which rank holds each step of a job back: step_stragglers.
-- Needs: cross_rank.steps (slow_rank_causes), cross_rank.communication (collective_waits).
--
-- In a job whose ranks meet in collectives, the rank with the longest step is often not the
-- one that holds the others back: a rank that arrives early at a collective waits there for
-- the last arrival, so its step grows by its waiting. The last arrival is the rank that
-- waited least (collective_waits: its collectives' time above the shortest part of each,
-- summed over the step). Set beside the longest step, it tells a straggler (the last
-- arrival, whose own work is slow) from a rank made long by waiting for it.

-- One row per (job, step) with collective waits or a step breakdown: ranks; the last
-- arrival (last_arrival_rank, the least wait_ns; ties: the lowest rank) and its wait; the
-- rank that waited most and its wait; the wait the last arrival cost the others
-- (waited_for_ns: the sum over ranks of their wait above the last arrival's); and the
-- rank with the longest step (slowest_rank, its step_ns and recoverable_ns of
-- slow_rank_causes).
CREATE OR REPLACE VIEW step_stragglers AS
WITH waits AS (
    SELECT job_id, step, rank, wait_ns,
        row_number() OVER (PARTITION BY job_id, step ORDER BY wait_ns, rank) AS least,
        row_number() OVER (PARTITION BY job_id, step ORDER BY wait_ns DESC, rank) AS most,
        count(*) OVER (PARTITION BY job_id, step) AS ranks,
        sum(wait_ns) OVER (PARTITION BY job_id, step)
            - count(*) OVER (PARTITION BY job_id, step)
              * min(wait_ns) OVER (PARTITION BY job_id, step) AS waited_for_ns
    FROM collective_waits
), arrivals AS (
    SELECT l.job_id, l.step, l.ranks, l.rank AS last_arrival_rank,
        l.wait_ns AS last_arrival_wait_ns, m.rank AS most_waiting_rank,
        m.wait_ns AS most_wait_ns, l.waited_for_ns::BIGINT AS waited_for_ns
    FROM waits l JOIN waits m USING (job_id, step)
    WHERE l.least = 1 AND m.most = 1
)
SELECT job_id, step, coalesce(a.ranks, c.ranks) AS ranks, a.last_arrival_rank,
    a.last_arrival_wait_ns, a.most_waiting_rank, a.most_wait_ns, a.waited_for_ns,
    c.rank AS slowest_rank, c.step_ns AS slowest_step_ns, c.recoverable_ns
FROM arrivals a
FULL JOIN slow_rank_causes c USING (job_id, step);
