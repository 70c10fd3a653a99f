-- Where each core's time goes within its invocation, and how evenly the cores are loaded.
-- Needs: units, records.names, records.aligned_records.

-- One row per invocation and core that wrote records. The invocation's makespan runs from
-- its earliest record start to its latest record end over all its cores. Each core's
-- records are laid on that span in record order, each clipped to the time after the
-- core's previous records (records that overlap count once); what lies between is the
-- front gap (before the first record), the gaps between records and the tail gap (after
-- the last). Times are differences of rounded ns points (cycle_ns), so per core
-- compute_ns + wait_ns + trigger_ns + control_ns + front_gap_ns + gap_ns + tail_gap_ns
-- equals makespan_ns exactly. control_ns is TerminateTask records; shares are of the
-- makespan.
CREATE OR REPLACE VIEW core_breakdown AS
-- (Keyed by the invocation's ids alone until the end: grouping and windows over its
-- names as well cost a third more.)
WITH spans AS (
    SELECT run_id, rank, invocation_id, write_id,
        min(start_cycle) AS span_start, max(end_cycle) AS span_end
    FROM aligned_raw_records
    GROUP BY ALL
),
placed AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id, phase, start_cycle,
        end_cycle,
        max(end_cycle) OVER (
            PARTITION BY run_id, rank, invocation_id, write_id, core_type, block_id
            ORDER BY record_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS before_end
    FROM aligned_raw_records
),
pieces AS (
    SELECT
        p.run_id, p.rank, p.invocation_id, p.write_id, p.core_type, p.block_id, p.phase,
        s.span_start, s.span_end, i.anchor_cycle, i.frequency_hz,
        p.before_end IS NULL AS first,
        cycle_ns(coalesce(p.before_end, s.span_start), i.anchor_cycle, i.frequency_hz) AS cursor_ns,
        cycle_ns(greatest(p.start_cycle, coalesce(p.before_end, s.span_start)), i.anchor_cycle,
            i.frequency_hz) AS piece_start_ns,
        cycle_ns(greatest(p.end_cycle, coalesce(p.before_end, s.span_start)), i.anchor_cycle,
            i.frequency_hz) AS piece_end_ns
    FROM placed p
    JOIN spans s
        ON s.run_id = p.run_id AND s.rank = p.rank AND s.invocation_id = p.invocation_id
        AND s.write_id = p.write_id
    JOIN invocations i
        ON i.run_id = p.run_id AND i.rank = p.rank AND i.invocation_id = p.invocation_id
        AND i.write_id = p.write_id
),
cores AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id,
        count(*) AS records,
        any_value(cycle_ns(span_end, anchor_cycle, frequency_hz)
            - cycle_ns(span_start, anchor_cycle, frequency_hz)) AS makespan_ns,
        coalesce(sum(piece_end_ns - piece_start_ns) FILTER (WHERE phase = 'compute'), 0)::BIGINT
            AS compute_ns,
        coalesce(sum(piece_end_ns - piece_start_ns) FILTER (WHERE phase = 'wait'), 0)::BIGINT
            AS wait_ns,
        coalesce(sum(piece_end_ns - piece_start_ns) FILTER (WHERE phase = 'trigger'), 0)::BIGINT
            AS trigger_ns,
        coalesce(sum(piece_end_ns - piece_start_ns) FILTER (WHERE phase = 'terminate'), 0)
            ::BIGINT AS control_ns,
        sum(piece_start_ns - cursor_ns) FILTER (WHERE first)::BIGINT AS front_gap_ns,
        coalesce(sum(piece_start_ns - cursor_ns) FILTER (WHERE NOT first), 0)::BIGINT AS gap_ns,
        any_value(cycle_ns(span_end, anchor_cycle, frequency_hz)) - max(piece_end_ns)
            AS tail_gap_ns
    FROM pieces
    GROUP BY run_id, rank, invocation_id, write_id, core_type, block_id
)
SELECT
    c.run_id, i.step, c.rank, c.invocation_id, c.write_id, i.kernel_name, i.direction,
    core_name(c.core_type) AS core,
    c.core_type, c.block_id, c.records, c.makespan_ns, c.compute_ns, c.wait_ns, c.trigger_ns,
    c.control_ns, c.front_gap_ns, c.gap_ns, c.tail_gap_ns,
    c.compute_ns / c.makespan_ns AS compute_share,
    c.wait_ns / c.makespan_ns AS wait_share,
    c.trigger_ns / c.makespan_ns AS trigger_share,
    c.control_ns / c.makespan_ns AS control_share,
    c.front_gap_ns / c.makespan_ns AS front_gap_share,
    c.gap_ns / c.makespan_ns AS gap_share,
    c.tail_gap_ns / c.makespan_ns AS tail_gap_share
FROM cores c
JOIN invocations i
    ON i.run_id = c.run_id AND i.rank = c.rank AND i.invocation_id = c.invocation_id
    AND i.write_id = c.write_id;

-- One row per invocation and core type: how evenly its cores are loaded. A core's busy
-- time is its compute, trigger and control time (not its waits or gaps); cores that
-- wrote no record are not counted. imbalance = 1 - mean / max busy; imbalanced flags a
-- spread of more than 5 % of the busiest ((max - min) / max > 0.05, msprof-analyze's rule
-- for AIC/AIV load).
CREATE OR REPLACE VIEW core_imbalance AS
WITH busy AS (
    SELECT *, compute_ns + trigger_ns + control_ns AS busy_ns FROM core_breakdown
)
SELECT
    run_id, step, rank, invocation_id, write_id, kernel_name, direction, core, core_type,
    count(*) AS cores,
    any_value(makespan_ns) AS makespan_ns,
    arg_max(block_id, (busy_ns, -block_id::BIGINT)) AS busiest_block_id,
    max(busy_ns) AS max_busy_ns,
    min(busy_ns) AS min_busy_ns,
    avg(busy_ns) AS mean_busy_ns,
    CASE WHEN max(busy_ns) > 0 THEN 1 - avg(busy_ns) / max(busy_ns) ELSE 0 END AS imbalance,
    coalesce(max(busy_ns) - min(busy_ns) > 0.05 * max(busy_ns), false) AS imbalanced
FROM busy
GROUP BY ALL;
