-- The observed critical path of each invocation: what its last-finishing record waited
-- for, walked back to the invocation's start.
-- Needs: units, records.names, records.records_ns, records.task_edges (task_releases,
-- task_dependencies),
-- critical_path_tolerance (the macro critical_path_tolerance_cycles(), a store setting).
--
-- The walk starts at the record that ends last (ties: the lowest core type, block, then
-- the highest record index). At a wait that its releasing trigger bound (the trigger
-- ended while the wait waited: wait start <= trigger end <= wait end <= trigger end +
-- the tolerance), it continues at that trigger; anywhere else at the previous record of
-- the same core; at a core's first record it ends with the front gap back to the
-- invocation's first start. In a graph of recorded predecessors (task_dependencies) a
-- compute record whose start its dependencies held is crossed too: its last-finishing
-- predecessor (ties: the lowest core type, block, then the highest record index) ended
-- after the previous record of its core (or it is its core's first) and no later than
-- its start + the tolerance; the walk continues at that predecessor, and the time between
-- the predecessor's end and the record's start is data_wait.
-- The time between the crossed wait's trigger end and its own
-- end is data_wait (the release latency); time between two records of the same core is
-- core_wait; a wait the walk does not cross is wait. The pieces tile the makespan: per
-- invocation their dur_ns (differences of rounded ns points) add up to makespan_ns
-- exactly.

-- Records the walk crosses to another core, one row each: waits to their releasing
-- trigger (dependency false), held compute records to their last-finishing predecessor.
CREATE OR REPLACE VIEW _critical_crossings AS
SELECT
    run_id, rank, invocation_id, write_id,
    dst_core_type AS core_type, dst_block_id AS block_id, dst_record_index AS record_index,
    src_core_type, src_block_id, src_record_index, src_end_cycle, false AS dependency
FROM task_releases
WHERE dst_start_cycle <= src_end_cycle AND src_end_cycle <= dst_end_cycle
    AND dst_end_cycle <= src_end_cycle + critical_path_tolerance_cycles()
UNION ALL
SELECT
    run_id, rank, invocation_id, write_id, core_type, block_id, record_index,
    src_core_type, src_block_id, src_record_index, src_end_cycle, true
FROM task_last_dependencies
WHERE (previous_end_cycle IS NULL OR src_end_cycle > previous_end_cycle)
    AND src_end_cycle <= start_cycle + critical_path_tolerance_cycles();

-- Per invocation: its span, its record count and the record that ends last.
CREATE OR REPLACE VIEW _critical_ends AS
SELECT
    r.run_id, r.rank, r.invocation_id, r.write_id,
    min(r.start_cycle) AS span_start, max(r.end_cycle) AS span_end, count(*) AS records,
    arg_max(
        {'core_type': r.core_type, 'block_id': r.block_id, 'record_index': r.record_index},
        (r.end_cycle, -r.core_type::INT, -r.block_id::BIGINT, r.record_index)
    ) AS last
FROM aligned_records r
GROUP BY ALL;

-- Where the walk goes on from each crossed wait (and from each invocation's last record):
-- the trigger's core, from the latest crossed wait at or before the trigger there (lo;
-- NULL: from the core's first record, lo_released: that wait's trigger end) up to the
-- trigger (hi). A window over crossed waits and these probes in record order finds lo, as
-- an ASOF join would (DuckDB plans an ASOF join over a view as a nested loop).
CREATE OR REPLACE VIEW _critical_links AS
WITH crossings AS MATERIALIZED (SELECT * FROM _critical_crossings),
probes AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id, record_index,
        src_end_cycle, dependency, false AS probe, NULL::UTINYINT AS from_core_type,
        NULL::UINTEGER AS from_block_id, NULL::UINTEGER AS from_record_index
    FROM crossings
    UNION ALL
    SELECT
        run_id, rank, invocation_id, write_id, src_core_type, src_block_id, src_record_index,
        NULL, NULL, true, core_type, block_id, record_index
    FROM crossings
    UNION ALL
    SELECT
        run_id, rank, invocation_id, write_id, last.core_type, last.block_id,
        last.record_index, NULL, NULL, true, NULL, NULL, NULL
    FROM _critical_ends
)
SELECT
    run_id, rank, invocation_id, write_id, from_core_type, from_block_id, from_record_index,
    core_type, block_id, record_index AS hi,
    last_value(CASE WHEN NOT probe THEN record_index END IGNORE NULLS) OVER core AS lo,
    last_value(CASE WHEN NOT probe THEN src_end_cycle END IGNORE NULLS) OVER core
        AS lo_released,
    last_value(CASE WHEN NOT probe THEN dependency END IGNORE NULLS) OVER core
        AS lo_dependency
FROM probes
WINDOW core AS (
    PARTITION BY run_id, rank, invocation_id, write_id, core_type, block_id
    ORDER BY record_index, probe
    ROWS UNBOUNDED PRECEDING
)
QUALIFY probe;

-- The walk as segments of one core each (seg 0 ends at the last record), lo..hi by record
-- index. (The inputs are materialized once: the recursive part runs once per segment.)
CREATE OR REPLACE VIEW _critical_segments AS
WITH RECURSIVE
links AS MATERIALIZED (SELECT * FROM _critical_links),
ends AS MATERIALIZED (SELECT * FROM _critical_ends),
segments AS (
    SELECT
        e.run_id, e.rank, e.invocation_id, e.write_id, e.records, e.span_start, e.span_end,
        0 AS seg, l.core_type, l.block_id, l.lo, l.lo_released, l.lo_dependency, l.hi
    FROM ends e
    JOIN links l
        ON l.run_id = e.run_id AND l.rank = e.rank AND l.invocation_id = e.invocation_id
        AND l.write_id = e.write_id AND l.from_core_type IS NULL
    UNION ALL
    SELECT
        s.run_id, s.rank, s.invocation_id, s.write_id, s.records, s.span_start, s.span_end,
        -- A walk longer than the invocation's records has gone round a cycle of
        -- inconsistent clocks: say so rather than loop.
        CASE WHEN s.seg < s.records THEN s.seg + 1 ELSE error(
            'critical_path: the walk back from the last record of run ' || s.run_id
            || ' rank ' || s.rank || ' invocation ' || s.invocation_id
            || ' goes round a cycle; its records'' clocks are inconsistent'
        ) END,
        l.core_type, l.block_id, l.lo, l.lo_released, l.lo_dependency, l.hi
    FROM segments s
    JOIN links l
        ON l.run_id = s.run_id AND l.rank = s.rank AND l.invocation_id = s.invocation_id
        AND l.write_id = s.write_id AND l.from_core_type = s.core_type
        AND l.from_block_id = s.block_id AND l.from_record_index = s.lo
)
SELECT * EXCLUDE (records) FROM segments;

-- One row per piece of each invocation's critical path, seq 0 first in time (the front
-- gap). kind: compute, trigger, control (TerminateTask), wait, data_wait, core_wait,
-- front_gap. A record's piece names its stage, task, owner and record, and so does the
-- data_wait before a held compute record; a gap names the core it lies on. start_ns is
-- from the invocation's anchor cycle.
CREATE OR REPLACE VIEW critical_path AS
WITH items AS (
    SELECT
        r.run_id, r.step, r.rank, r.invocation_id, r.write_id, r.core_type, r.block_id,
        r.record_index, r.task_id, r.desc_id, r.owner_id, r.phase, s.seg, s.span_start,
        s.span_end,
        r.record_index IS NOT DISTINCT FROM s.lo AS crossed,
        r.record_index IS NOT DISTINCT FROM s.lo AND s.lo_dependency AS held,
        r.start_cycle AS own_start,
        r.end_cycle AS end_point,
        CASE WHEN r.record_index IS NOT DISTINCT FROM s.lo THEN
            CASE WHEN s.lo_dependency THEN least(s.lo_released, r.start_cycle)
                 ELSE s.lo_released END
             ELSE r.start_cycle END AS start_point
    FROM _critical_segments s
    JOIN aligned_records r
        ON r.run_id = s.run_id AND r.rank = s.rank AND r.invocation_id = s.invocation_id
        AND r.write_id = s.write_id AND r.core_type = s.core_type AND r.block_id = s.block_id
        AND r.record_index BETWEEN coalesce(s.lo, 0) AND s.hi
),
walked AS (
    SELECT
        *,
        coalesce(
            min(start_point) OVER (
                PARTITION BY run_id, rank, invocation_id, write_id
                ORDER BY seg, record_index DESC
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
            ),
            span_end
        ) AS after
    FROM items
),
pieces AS (
    -- Each record's piece (a held record's from its own start), the data_wait before a
    -- held record, then the core_wait gap after each (up to the next piece).
    SELECT
        *, 0 AS part,
        least(CASE WHEN held THEN own_start ELSE start_point END, end_point, after) AS lo_cycle,
        least(end_point, after) AS hi_cycle,
        CASE phase WHEN 'compute' THEN 'compute' WHEN 'trigger' THEN 'trigger'
            WHEN 'terminate' THEN 'control'
            ELSE CASE WHEN crossed THEN 'data_wait' ELSE 'wait' END END AS kind
    FROM walked
    UNION ALL
    SELECT *, 1, least(end_point, after), after, 'core_wait'
    FROM walked
    WHERE end_point < after
    UNION ALL
    SELECT *, -1, least(start_point, after), least(own_start, after), 'data_wait'
    FROM walked
    WHERE held AND start_point < least(own_start, after)
    UNION ALL
    -- The front gap, before the first piece, on the core the walk ended on.
    SELECT
        *, -2, span_start, least(start_point, end_point, after), 'front_gap'
    FROM walked
    QUALIFY row_number() OVER (
        PARTITION BY run_id, rank, invocation_id, write_id ORDER BY seg DESC, record_index
    ) = 1 AND least(start_point, end_point, after) > span_start
)
SELECT
    p.run_id, p.step, p.rank, p.invocation_id, p.write_id, i.kernel_name, i.direction,
    (row_number() OVER (
        PARTITION BY p.run_id, p.rank, p.invocation_id, p.write_id
        ORDER BY p.seg DESC, p.record_index, p.part
    ) - 1)::BIGINT AS seq,
    core_name(p.core_type) AS core,
    p.core_type, p.block_id, p.kind,
    CASE WHEN p.part IN (0, -1) THEN stage_name(
        i.stage_names, record_stage_desc_id(p.phase, p.desc_id, g.desc_id, t.stage_desc_id)
    ) END AS stage,
    CASE WHEN p.part IN (0, -1) THEN p.task_id END AS task_id,
    CASE WHEN p.part IN (0, -1) THEN p.owner_id END AS owner_id,
    CASE WHEN p.part IN (0, -1) THEN p.record_index END AS record_index,
    p.lo_cycle AS start_cycle,
    cycle_ns(p.lo_cycle, i.anchor_cycle, i.frequency_hz) AS start_ns,
    cycle_ns(p.hi_cycle, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(p.lo_cycle, i.anchor_cycle, i.frequency_hz) AS dur_ns,
    cycle_ns(p.span_end, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(p.span_start, i.anchor_cycle, i.frequency_hz) AS makespan_ns
FROM pieces p
JOIN invocations i
    ON i.run_id = p.run_id AND i.rank = p.rank AND i.invocation_id = p.invocation_id
    AND i.write_id = p.write_id
LEFT JOIN tasks g
    ON p.part = 0 AND p.phase <> 'compute' AND g.run_id = p.run_id AND g.rank = p.rank
    AND g.config_id = i.config_id AND g.task_id = p.task_id
LEFT JOIN task_stages t
    ON p.part = 0 AND p.phase <> 'compute' AND t.run_id = p.run_id AND t.rank = p.rank
    AND t.invocation_id = p.invocation_id AND t.write_id = p.write_id
    AND t.task_id = p.task_id;

-- Share of each invocation's makespan per stage and kind on its critical path (HTA's
-- bound_by, in the kernel's terms); gaps have no stage.
CREATE OR REPLACE VIEW critical_path_summary AS
SELECT
    run_id, step, rank, invocation_id, write_id, kernel_name, direction, stage, kind,
    count(*) AS pieces,
    sum(dur_ns)::BIGINT AS dur_ns,
    any_value(makespan_ns) AS makespan_ns,
    sum(dur_ns) / any_value(makespan_ns) AS share
FROM critical_path
GROUP BY ALL;
