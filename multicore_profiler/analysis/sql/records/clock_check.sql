-- The clock checks of each run in one row: what `mcprof check --clocks` and
-- Store.check(clocks=True) judge a run by (docs/clocks.md).
-- Needs: records.clock_sanity, records.clock_frequency, records.schedule_sanity.

-- Per run: its invocations and cores; the causal edges its records contradict, beyond the
-- tolerance or not, the largest contradiction and the invocations holding one beyond the
-- tolerance; the cores whose records run backwards, overlap on a core with one writer, or
-- start before their core's entry cycle (clock_sanity's verdicts); the workers that ran
-- other than their planned queue (schedule_sanity's verdicts but ok and dropped), those
-- whose slot dropped records, and the events whose waits and triggers disagree
-- (event_sanity's unreleased, extra_triggers and missing_triggers); the frequency check of
-- its (rank, device) groups (clock_frequency): the worst verdict (contradictory, then
-- too_low or too_high, ok, untimed) with its group's figures, and every group whose stored
-- frequency the host's launch times rule out.
CREATE OR REPLACE VIEW clock_check AS
WITH cores AS (
    SELECT
        run_id,
        count(DISTINCT (rank, invocation_id)) AS invocations,
        count(*) AS cores,
        count(*) FILTER (WHERE verdict = 'backwards') AS backwards_cores,
        count(*) FILTER (WHERE verdict = 'overlapping') AS overlapping_cores,
        count(*) FILTER (WHERE verdict = 'late_entry') AS late_entry_cores
    FROM clock_sanity
    GROUP BY run_id
),
edges AS (
    SELECT
        run_id,
        count(*) AS contradicted_edges,
        count(*) FILTER (WHERE beyond_tolerance) AS edges_beyond_tolerance,
        max(violation_ns) AS max_violation_ns,
        count(DISTINCT (rank, invocation_id)) FILTER (WHERE beyond_tolerance)
            AS contradicted_invocations
    FROM clock_violations
    GROUP BY run_id
),
workers AS (
    SELECT
        run_id,
        count(*) FILTER (WHERE verdict NOT IN ('ok', 'dropped')) AS faulty_workers,
        count(*) FILTER (WHERE verdict = 'dropped') AS dropped_workers
    FROM schedule_sanity
    GROUP BY run_id
),
frequencies AS (
    SELECT
        run_id,
        arg_max(
            {'verdict': verdict, 'frequency_hz': frequency_hz, 'low_hz': low_hz,
             'high_hz': high_hz, 'fitting_hz': fitting_hz},
            severity
        ) AS worst,
        list(
            {'rank': rank, 'device': device, 'verdict': verdict, 'frequency_hz': frequency_hz,
             'low_hz': low_hz, 'high_hz': high_hz, 'fitting_hz': fitting_hz}
            ORDER BY rank, device, frequency_hz
        ) FILTER (WHERE severity >= 2) AS frequency_faults
    FROM (
        SELECT
            *,
            CASE verdict
                WHEN 'contradictory' THEN 3 WHEN 'too_low' THEN 2 WHEN 'too_high' THEN 2
                WHEN 'ok' THEN 1 ELSE 0
            END AS severity
        FROM clock_frequency
    )
    GROUP BY run_id
),
events AS (
    SELECT
        run_id,
        count(*) FILTER (
            WHERE verdict IN ('unreleased', 'extra_triggers', 'missing_triggers')
        ) AS faulty_events
    FROM event_sanity
    GROUP BY run_id
)
SELECT
    c.run_id, c.invocations, c.cores,
    coalesce(e.contradicted_edges, 0) AS contradicted_edges,
    coalesce(e.edges_beyond_tolerance, 0) AS edges_beyond_tolerance,
    e.max_violation_ns,
    coalesce(e.contradicted_invocations, 0) AS contradicted_invocations,
    clock_tolerance_ns() AS tolerance_ns,
    c.backwards_cores, c.overlapping_cores, c.late_entry_cores,
    coalesce(w.faulty_workers, 0) AS faulty_workers,
    coalesce(w.dropped_workers, 0) AS dropped_workers,
    coalesce(v.faulty_events, 0) AS faulty_events,
    coalesce(f.worst.verdict, 'untimed') AS frequency_verdict,
    f.worst.frequency_hz AS frequency_hz, f.worst.low_hz AS low_hz,
    f.worst.high_hz AS high_hz, f.worst.fitting_hz AS fitting_hz,
    coalesce(f.frequency_faults, []) AS frequency_faults
FROM cores c
LEFT JOIN edges e USING (run_id)
LEFT JOIN workers w USING (run_id)
LEFT JOIN events v USING (run_id)
LEFT JOIN frequencies f USING (run_id)
ORDER BY c.run_id;
