-- Frequency sanity: each run's counter frequency against the host's launch-to-synchronize
-- times (docs/clocks.md). Needs: units, records.aligned_records (aligned_cycle).
--
-- A capture session times each launch on the host's monotonic clock: host_launch_ns just
-- before it, host_sync_ns once the host knew its kernel had finished. The kernel ran
-- between them, and the device counter its records carry is free-running and shared by
-- every invocation of a device (Ascend's system counter; the CPU kernel's perf_counter).
-- An invocation's span on the counter runs from first_cycle (its earliest entry cycle or
-- record start) to last_cycle (its latest record end). For invocations i and j, j launched
-- no earlier than i (i = j: one invocation):
-- * lower bound: last_j - first_i cycles took at most host_sync_j - host_launch_i ns, so
--   the frequency is at least (last_j - first_i) / (host_sync_j - host_launch_i) * 1e9;
-- * upper bound: where host_sync_i < host_launch_j, the cycles first_j - last_i took at
--   least host_launch_j - host_sync_i ns (the counter ran on between the kernels), so the
--   frequency is at most (first_j - last_i) / (host_launch_j - host_sync_i) * 1e9.
-- The pairs used, in launch order (host_launch_ns, then invocation id) within a run, rank,
-- device and frequency: for the lower bound each invocation alone, each two consecutive
-- ones and the first with the last; for the upper bound each two consecutive ones and the
-- first with the last. Cycles are each core's counter as read, placed on the invocation's
-- common clock by the producer's own anchor (cores.clock_offset_cycles: none for mcprof's
-- own captures, whose cores share one counter), never by an applied clock correction (an
-- estimate): the bounds are physical, and judged exactly, without tolerance.

-- Each invocation with both host times and at least one record, and its span on the
-- counter.
CREATE OR REPLACE VIEW _clock_frequency_spans AS
WITH core_spans AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id,
        min(start_cycle) AS first_start, max(end_cycle) AS last_end
    FROM records
    GROUP BY ALL
)
SELECT
    i.run_id, i.rank, i.device, i.frequency_hz, i.invocation_id, i.write_id, i.step,
    i.host_launch_ns, i.host_sync_ns,
    min(least(
        aligned_cycle(c.entry_cycle, c.clock_offset_cycles),
        aligned_cycle(s.first_start, c.clock_offset_cycles)
    )) AS first_cycle,
    max(aligned_cycle(s.last_end, c.clock_offset_cycles)) AS last_cycle
FROM invocations i
JOIN cores c
    ON c.run_id = i.run_id AND c.rank = i.rank AND c.invocation_id = i.invocation_id
    AND c.write_id = i.write_id
LEFT JOIN core_spans s
    ON s.run_id = c.run_id AND s.rank = c.rank AND s.invocation_id = c.invocation_id
    AND s.write_id = c.write_id AND s.core_type = c.core_type AND s.block_id = c.block_id
WHERE i.host_launch_ns IS NOT NULL AND i.host_sync_ns IS NOT NULL
GROUP BY ALL
HAVING max(s.last_end) IS NOT NULL;

-- Every bound the pairs give: kind ('low' or 'high'), the invocations of the pair (from,
-- to), the cycles and host ns compared, and the frequency in Hz they bound.
CREATE OR REPLACE VIEW clock_frequency_bounds AS
WITH ordered AS (
    SELECT
        *,
        lag(invocation_id) OVER g AS previous_id,
        lag(first_cycle) OVER g AS previous_first,
        lag(last_cycle) OVER g AS previous_last,
        lag(host_launch_ns) OVER g AS previous_launch,
        lag(host_sync_ns) OVER g AS previous_sync,
        first_value(invocation_id) OVER whole AS first_id,
        first_value(first_cycle) OVER whole AS first_first,
        first_value(last_cycle) OVER whole AS first_last,
        first_value(host_launch_ns) OVER whole AS first_launch,
        first_value(host_sync_ns) OVER whole AS first_sync,
        row_number() OVER g = count(*) OVER whole AS is_last
    FROM _clock_frequency_spans
    WINDOW
        g AS (PARTITION BY run_id, rank, device, frequency_hz
              ORDER BY host_launch_ns, invocation_id),
        whole AS (PARTITION BY run_id, rank, device, frequency_hz
                  ORDER BY host_launch_ns, invocation_id
                  ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
),
pairs AS (
    SELECT run_id, rank, device, frequency_hz, 'low' AS kind, 'single' AS pair,
        invocation_id AS from_invocation, invocation_id AS to_invocation,
        last_cycle::HUGEINT - first_cycle AS cycles, host_sync_ns - host_launch_ns AS ns
    FROM ordered
    UNION ALL
    SELECT run_id, rank, device, frequency_hz, 'low', 'consecutive',
        previous_id, invocation_id,
        last_cycle::HUGEINT - previous_first, host_sync_ns - previous_launch
    FROM ordered WHERE previous_id IS NOT NULL
    UNION ALL
    SELECT run_id, rank, device, frequency_hz, 'high', 'consecutive',
        previous_id, invocation_id,
        first_cycle::HUGEINT - previous_last, host_launch_ns - previous_sync
    FROM ordered WHERE previous_id IS NOT NULL
    UNION ALL
    SELECT run_id, rank, device, frequency_hz, 'low', 'first_last',
        first_id, invocation_id,
        last_cycle::HUGEINT - first_first, host_sync_ns - first_launch
    FROM ordered WHERE is_last AND previous_id IS DISTINCT FROM first_id
        AND invocation_id <> first_id
    UNION ALL
    SELECT run_id, rank, device, frequency_hz, 'high', 'first_last',
        first_id, invocation_id,
        first_cycle::HUGEINT - first_last, host_launch_ns - first_sync
    FROM ordered WHERE is_last AND previous_id IS DISTINCT FROM first_id
        AND invocation_id <> first_id
)
SELECT
    run_id, rank, device, frequency_hz, kind, pair, from_invocation, to_invocation,
    cycles::BIGINT AS cycles, ns, cycles::DOUBLE * 1e9 / ns AS bound_hz
FROM pairs
WHERE ns > 0;

-- Per run, rank, device and frequency: the bounds and the verdict on the stored frequency.
-- * invocations: those with host times (and records), which the bounds use;
--   untimed_invocations: the others;
-- * low_hz: the largest lower bound, high_hz the smallest upper bound (NULL: none), each
--   with the pair of invocations that gives it (low_from_invocation, low_to_invocation, ...);
-- * fitting_hz: the frequency nearest to frequency_hz that both bounds allow (frequency_hz
--   itself where it fits; NULL where no frequency does);
-- * verdict, the first that applies: contradictory (low_hz > high_hz: the host times and
--   cycles contradict each other whatever the frequency, e.g. a counter reset), too_low
--   (frequency_hz < low_hz), too_high (frequency_hz > high_hz), ok (both bounds and
--   low_hz <= frequency_hz <= high_hz), untimed (a bound is missing: fewer than two timed
--   invocations one after the other).
CREATE OR REPLACE VIEW clock_frequency AS
WITH groups AS (
    SELECT
        i.run_id, i.rank, i.device, i.frequency_hz,
        count(s.invocation_id) AS invocations,
        count(*) - count(s.invocation_id) AS untimed_invocations
    FROM invocations i
    LEFT JOIN _clock_frequency_spans s
        ON s.run_id = i.run_id AND s.rank = i.rank AND s.invocation_id = i.invocation_id
        AND s.write_id = i.write_id
    GROUP BY ALL
),
bounds AS (
    SELECT
        run_id, rank, device, frequency_hz,
        max(bound_hz) FILTER (WHERE kind = 'low') AS low_hz,
        arg_max([from_invocation, to_invocation], (bound_hz, -from_invocation, -to_invocation))
            FILTER (WHERE kind = 'low') AS low_pair,
        min(bound_hz) FILTER (WHERE kind = 'high') AS high_hz,
        arg_min([from_invocation, to_invocation], (bound_hz, from_invocation, to_invocation))
            FILTER (WHERE kind = 'high') AS high_pair
    FROM clock_frequency_bounds
    GROUP BY ALL
),
judged AS (
    SELECT
        g.*, b.low_hz, b.high_hz, b.low_pair, b.high_pair,
        CASE
            WHEN b.low_hz > b.high_hz THEN 'contradictory'
            WHEN b.low_hz > g.frequency_hz THEN 'too_low'
            WHEN b.high_hz < g.frequency_hz THEN 'too_high'
            WHEN b.low_hz IS NOT NULL AND b.high_hz IS NOT NULL THEN 'ok'
            ELSE 'untimed'
        END AS verdict
    FROM groups g
    LEFT JOIN bounds b USING (run_id, rank, device, frequency_hz)
)
SELECT
    run_id, rank, device, invocations, frequency_hz, low_hz, high_hz,
    CASE verdict
        WHEN 'contradictory' THEN NULL
        WHEN 'too_low' THEN low_hz
        WHEN 'too_high' THEN high_hz
        ELSE frequency_hz
    END AS fitting_hz,
    verdict,
    untimed_invocations,
    low_pair[1] AS low_from_invocation, low_pair[2] AS low_to_invocation,
    high_pair[1] AS high_from_invocation, high_pair[2] AS high_to_invocation
FROM judged
ORDER BY run_id, rank, device, frequency_hz;
