-- Clock sanity: what the records' own causality says of the cores' clocks (docs/clocks.md).
-- Needs: units, records.names, records.task_edges, clock_tolerance (the macro
-- clock_tolerance_ns(), a store setting).
--
-- Two kinds of edge of the task DAG say that one record's moment came after another's,
-- whatever core each ran on:
-- * release: a wait ends no earlier than the trigger that released it ended;
-- * dependency: a task's compute starts no earlier than each predecessor's compute ended
--   (imported graphs of recorded predecessors).
-- On one counter shared by all cores these hold to the cycle. Where a core's clock is off
-- by d cycles, every edge into it from a core whose clock is right loses d cycles of slack,
-- and an edge with negative slack is a contradiction the records cannot hold.

-- Every causal edge, with the two cycles it compares (src_cycle: the source record's end;
-- dst_cycle: the wait's end, or the dependent compute's start) and its slack
-- dst_cycle - src_cycle: negative where the records contradict causality. Invocations whose
-- cores each counted on a clock of their own with no anchor (clock_domain per_core) have
-- none: their cores' cycles were never comparable.
CREATE OR REPLACE VIEW _clock_edges AS
SELECT
    e.run_id, e.step, e.rank, e.invocation_id, e.write_id, e.kind,
    e.src_core_type, e.src_block_id, e.src_record_index, e.src_task_id,
    e.src_end_cycle AS src_cycle,
    e.dst_core_type, e.dst_block_id, e.dst_record_index, e.dst_task_id,
    CASE e.kind WHEN 'release' THEN e.dst_end_cycle ELSE e.dst_start_cycle END AS dst_cycle,
    e.event,
    (dst_cycle::HUGEINT - src_cycle)::BIGINT AS slack_cycles
FROM (SELECT * FROM task_releases UNION ALL SELECT * FROM task_dependencies) e
ANTI JOIN (SELECT * FROM invocations WHERE clock_domain = 'per_core') p
    ON p.run_id = e.run_id AND p.rank = e.rank AND p.invocation_id = e.invocation_id
    AND p.write_id = e.write_id;

-- Each causal edge whose records contradict causality, with the size of the contradiction
-- (violation_ns: how long before the source record's end the dependent moment was
-- recorded) and whether it is beyond the tolerance.
CREATE OR REPLACE VIEW clock_violations AS
SELECT
    e.run_id, e.step, e.rank, e.invocation_id, e.kind,
    core_name(e.src_core_type) AS src_core, e.src_core_type, e.src_block_id,
    e.src_record_index, e.src_task_id,
    core_name(e.dst_core_type) AS dst_core, e.dst_core_type, e.dst_block_id,
    e.dst_record_index, e.dst_task_id, e.event,
    -e.slack_cycles AS violation_cycles,
    cycles_to_ns(-e.slack_cycles, i.frequency_hz) AS violation_ns,
    cycles_to_ns(-e.slack_cycles, i.frequency_hz) > clock_tolerance_ns() AS beyond_tolerance
FROM _clock_edges e
JOIN invocations i
    ON i.run_id = e.run_id AND i.rank = e.rank AND i.invocation_id = e.invocation_id
    AND i.write_id = e.write_id
WHERE e.slack_cycles < 0;

-- Per invocation and pair of cores (src: the releasing or preceding core), the tightest
-- constraint their edges put on the two clocks: offset(src) - offset(dst) <= slack_cycles,
-- with the edge that sets it. What the clock offsets are solved from.
CREATE OR REPLACE VIEW _clock_constraints AS
SELECT
    run_id, step, rank, invocation_id, write_id,
    src_core_type, src_block_id, dst_core_type, dst_block_id,
    min(slack_cycles) AS slack_cycles,
    count(*) AS edges,
    arg_min(
        {'kind': kind, 'src_task_id': src_task_id, 'dst_task_id': dst_task_id,
         'src_record_index': src_record_index, 'dst_record_index': dst_record_index},
        (slack_cycles, src_record_index, dst_record_index)
    ) AS tightest
FROM _clock_edges
GROUP BY ALL;

-- Per invocation and core: its records' own order (the core writes them one after another
-- on one counter) and the causal edges it takes part in.
-- * causality_violations: edges at the core (either end) whose records contradict
--   causality; max_violation_ns the largest of them (NULL: none);
-- * overlaps: records that start after the previous record on the core started but
--   before it ended;
-- * backwards: records that end before they start, or start before the previous record
--   on the core started (the counter ran backwards);
-- * late_entry_ns: how far after the core's first record its entry cycle lies (0: not);
-- * verdict: backwards, contradicted (a violation beyond the tolerance), overlapping,
--   late_entry or ok, the first that applies. Imported producers whose cores have several
--   writers (warps, groups) interleave their spans: their overlaps and backward starts are
--   counted but not judged.
CREATE OR REPLACE VIEW clock_sanity AS
WITH judged_invocations AS MATERIALIZED (  -- numbered: a key cheaper than the run's text id
    SELECT
        run_id, step, rank, invocation_id, write_id, frequency_hz,
        producer IS NULL AS one_writer, row_number() OVER () AS invocation_key
    FROM invocations
),
ordered AS (
    SELECT
        i.invocation_key, r.core_type, r.block_id, r.start_cycle, r.end_cycle,
        lag(r.start_cycle) OVER core AS previous_start,
        lag(r.end_cycle) OVER core AS previous_end
    FROM raw_records r
    JOIN judged_invocations i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    WINDOW core AS (
        PARTITION BY i.invocation_key, r.core_type, r.block_id ORDER BY r.record_index
    )
),
own AS (
    SELECT
        invocation_key, core_type, block_id,
        min(start_cycle) AS first_cycle,
        count(*) FILTER (
            WHERE start_cycle >= previous_start AND start_cycle < previous_end
        ) AS "overlaps",
        count(*) FILTER (WHERE end_cycle < start_cycle) AS reversed,
        count(*) FILTER (WHERE start_cycle < previous_start) AS earlier_starts
    FROM ordered
    GROUP BY ALL
),
edges AS MATERIALIZED (
    SELECT
        run_id, rank, invocation_id, write_id, src_core_type, src_block_id, dst_core_type,
        dst_block_id, slack_cycles
    FROM _clock_edges
),
ends AS (
    SELECT run_id, rank, invocation_id, write_id, src_core_type AS core_type,
        src_block_id AS block_id, slack_cycles
    FROM edges
    UNION ALL
    SELECT run_id, rank, invocation_id, write_id, dst_core_type, dst_block_id, slack_cycles
    FROM edges
    WHERE (src_core_type, src_block_id) <> (dst_core_type, dst_block_id)
),
at_core AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id,
        count(*) FILTER (WHERE slack_cycles < 0) AS causality_violations,
        max(-slack_cycles) FILTER (WHERE slack_cycles < 0) AS max_violation_cycles
    FROM ends
    GROUP BY ALL
),
judged AS (
    SELECT
        i.run_id, i.step, i.rank, i.invocation_id, c.core_type, c.block_id,
        coalesce(e.causality_violations, 0) AS causality_violations,
        cycles_to_ns(e.max_violation_cycles, i.frequency_hz) AS max_violation_ns,
        coalesce(o."overlaps", 0) AS "overlaps",
        coalesce(o.reversed, 0) + coalesce(o.earlier_starts, 0) AS backwards,
        cycles_to_ns(
            greatest(c.entry_cycle::HUGEINT - o.first_cycle, 0), i.frequency_hz
        ) AS late_entry_ns,
        i.one_writer,
        coalesce(o.reversed, 0) AS reversed
    FROM raw_cores c
    JOIN judged_invocations i
        ON i.run_id = c.run_id AND i.rank = c.rank AND i.invocation_id = c.invocation_id
        AND i.write_id = c.write_id
    LEFT JOIN own o
        ON o.invocation_key = i.invocation_key AND o.core_type = c.core_type
        AND o.block_id = c.block_id
    LEFT JOIN at_core e
        ON e.run_id = i.run_id AND e.rank = i.rank AND e.invocation_id = i.invocation_id
        AND e.write_id = i.write_id AND e.core_type = c.core_type AND e.block_id = c.block_id
)
SELECT
    run_id, rank, invocation_id, core_type, block_id,
    causality_violations, max_violation_ns, "overlaps", backwards,
    CASE
        WHEN reversed > 0 OR (one_writer AND backwards > 0) THEN 'backwards'
        WHEN max_violation_ns > clock_tolerance_ns() THEN 'contradicted'
        WHEN one_writer AND "overlaps" > 0 THEN 'overlapping'
        WHEN late_entry_ns > 0 THEN 'late_entry'
        ELSE 'ok'
    END AS verdict,
    step, core_name(core_type) AS core, late_entry_ns
FROM judged
ORDER BY run_id, rank, invocation_id, core_type, block_id;
