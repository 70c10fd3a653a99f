-- The task DAG's edges, per invocation (see DESIGN.md, "The task DAG"), one row each:
-- * release: a wait record (dst) and the trigger record (src) that released it: the
--   wait_count-th TriggerEvent of the wait's wait_event, ordered by end cycle (then
--   start cycle, task id), among the records of its invocation. Only invocations whose
--   kernel handed over its task graph (tasks) have them.
-- * dependency: a task's compute record (dst) and each compute record (src) of a task it
--   depends on, for graphs that list each task's predecessors as their producer recorded
--   them (tasks.depends_on: imported simpler graphs, which have no wait or trigger
--   records). mcprof's own graphs (depends_on NULL) have none.
-- * core_order: each record (src) and the next record on its core (dst), by record index.
-- Records are identified by core, block and record index; their task ids and cycles come
-- along for consumers that match records by value (the exporter). event is the released
-- event's id for release edges, NULL for core_order. write_id names the invocation's
-- write its records belong to.
-- Needs: records.aligned_records.

-- Whether an invocation (its run, rank and config) comes with its kernel's task graph. Pass
-- qualified columns (i.run_id): a bare run_id would name the graph's own column here.
CREATE OR REPLACE MACRO has_task_graph(run_id_, rank_, config_id_) AS EXISTS (
    SELECT 1 FROM tasks g WHERE g.run_id = run_id_ AND g.rank = rank_ AND g.config_id = config_id_
);

-- The release edges alone (kind = 'release'), with task_edges' columns: what wait
-- attribution and the critical path read, without ordering every record of each core.
CREATE OR REPLACE VIEW task_releases AS
WITH graphed AS (
    SELECT
        r.run_id, r.step, r.rank, r.invocation_id, r.write_id, r.core_type, r.block_id,
        r.record_index, r.task_id, r.desc_id, r.start_cycle, r.end_cycle,
        g.wait_event, g.wait_count, g.trigger_event, i.invocation_key
    -- aligned_raw_records joined to invocations is aligned_records, with each record's
    -- config and a number of its invocation's own: the triggers are ordered and matched
    -- by that number (several times faster than by the run's text id).
    FROM aligned_raw_records r
    JOIN (SELECT *, row_number() OVER () AS invocation_key FROM invocations) i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    JOIN tasks g
        ON g.run_id = r.run_id AND g.rank = r.rank AND g.config_id = i.config_id
        AND g.task_id = r.task_id
    WHERE r.desc_id IN (65536, 65543)  -- WaitDependency, TriggerEvent
),
-- Triggers are numbered within their invocation by its integer key; the rank and invocation
-- id ride along as partition and join keys (the key determines them) so that a filter on
-- them reaches the triggers too: a query of one invocation ranks its triggers only.
triggers AS (  -- only what the edge takes: the window sorts every column it carries
    SELECT
        invocation_key, rank, invocation_id, trigger_event, core_type, block_id,
        record_index, task_id, start_cycle, end_cycle,
        row_number() OVER (
            PARTITION BY invocation_key, rank, invocation_id, trigger_event
            ORDER BY end_cycle, start_cycle, task_id
        ) AS nth
    FROM graphed
    WHERE desc_id = 65543 AND trigger_event >= 0
),
waits AS (
    SELECT * FROM graphed WHERE desc_id = 65536 AND wait_event >= 0
)
SELECT
    w.run_id, w.step, w.rank, w.invocation_id, w.write_id, 'release' AS kind,
    t.core_type AS src_core_type, t.block_id AS src_block_id,
    t.record_index AS src_record_index, t.task_id AS src_task_id,
    t.start_cycle AS src_start_cycle, t.end_cycle AS src_end_cycle,
    w.core_type AS dst_core_type, w.block_id AS dst_block_id,
    w.record_index AS dst_record_index, w.task_id AS dst_task_id,
    w.start_cycle AS dst_start_cycle, w.end_cycle AS dst_end_cycle,
    w.wait_event AS event
FROM waits w
JOIN triggers t
    ON t.invocation_key = w.invocation_key AND t.rank = w.rank
    AND t.invocation_id = w.invocation_id AND t.trigger_event = w.wait_event
    AND t.nth = w.wait_count;

-- The dependency edges alone (kind = 'dependency'), with task_edges' columns: what wait
-- attribution and the critical path read for graphs of recorded predecessors.
CREATE OR REPLACE VIEW task_dependencies AS
WITH needs AS MATERIALIZED (
    SELECT g.run_id, g.rank, g.config_id, g.task_id, unnest(g.depends_on) AS pred_task_id
    FROM tasks g
    WHERE len(g.depends_on) > 0
),
computes AS (
    SELECT
        r.run_id, r.step, r.rank, r.invocation_id, r.write_id, r.core_type, r.block_id,
        r.record_index, r.task_id, r.start_cycle, r.end_cycle, i.config_id
    FROM aligned_raw_records r
    JOIN invocations i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    WHERE r.phase = 'compute'
        AND i.config_id IN (SELECT config_id FROM needs)
)
SELECT
    d.run_id, d.step, d.rank, d.invocation_id, d.write_id, 'dependency' AS kind,
    s.core_type AS src_core_type, s.block_id AS src_block_id,
    s.record_index AS src_record_index, s.task_id AS src_task_id,
    s.start_cycle AS src_start_cycle, s.end_cycle AS src_end_cycle,
    d.core_type AS dst_core_type, d.block_id AS dst_block_id,
    d.record_index AS dst_record_index, d.task_id AS dst_task_id,
    d.start_cycle AS dst_start_cycle, d.end_cycle AS dst_end_cycle,
    NULL::INTEGER AS event
FROM needs n
JOIN computes d
    ON d.run_id = n.run_id AND d.rank = n.rank AND d.config_id = n.config_id
    AND d.task_id = n.task_id
JOIN computes s
    ON s.run_id = d.run_id AND s.rank = d.rank AND s.invocation_id = d.invocation_id
    AND s.write_id = d.write_id AND s.task_id = n.pred_task_id;

-- Each compute record with dependency edges, its last-finishing predecessor (ties: the
-- lowest core type, block, then the highest record index) and the end of the previous
-- record on its core (NULL: it is its core's first): what the critical path and wait
-- attribution charge its start to.
CREATE OR REPLACE VIEW task_last_dependencies AS
WITH last AS (
    SELECT
        run_id, rank, invocation_id, write_id, dst_core_type, dst_block_id,
        dst_record_index, any_value(dst_start_cycle) AS dst_start_cycle,
        arg_max(
            {'core_type': src_core_type, 'block_id': src_block_id,
             'record_index': src_record_index, 'end_cycle': src_end_cycle},
            (src_end_cycle, -src_core_type::INT, -src_block_id::BIGINT, src_record_index)
        ) AS src
    FROM task_dependencies
    GROUP BY run_id, rank, invocation_id, write_id, dst_core_type, dst_block_id,
        dst_record_index
)
SELECT
    l.run_id, l.rank, l.invocation_id, l.write_id,
    l.dst_core_type AS core_type, l.dst_block_id AS block_id,
    l.dst_record_index AS record_index, l.dst_start_cycle AS start_cycle,
    l.src.core_type AS src_core_type, l.src.block_id AS src_block_id,
    l.src.record_index AS src_record_index, l.src.end_cycle AS src_end_cycle,
    p.end_cycle AS previous_end_cycle
FROM last l
LEFT JOIN aligned_raw_records p
    ON p.run_id = l.run_id AND p.rank = l.rank AND p.invocation_id = l.invocation_id
    AND p.write_id = l.write_id AND p.core_type = l.dst_core_type
    AND p.block_id = l.dst_block_id AND p.record_index + 1 = l.dst_record_index;

CREATE OR REPLACE VIEW task_edges AS
WITH ordered AS (
    SELECT
        run_id, step, rank, invocation_id, write_id, core_type, block_id, record_index,
        task_id, start_cycle, end_cycle,
        lead(record_index) OVER core AS next_index,
        lead(task_id) OVER core AS next_task_id,
        lead(start_cycle) OVER core AS next_start_cycle,
        lead(end_cycle) OVER core AS next_end_cycle
    FROM aligned_records
    WINDOW core AS (
        PARTITION BY run_id, rank, invocation_id, write_id, core_type, block_id
        ORDER BY record_index
    )
)
SELECT * FROM task_releases
UNION ALL
SELECT * FROM task_dependencies
UNION ALL
SELECT
    run_id, step, rank, invocation_id, write_id, 'core_order',
    core_type, block_id, record_index, task_id, start_cycle, end_cycle,
    core_type, block_id, next_index, next_task_id, next_start_cycle, next_end_cycle,
    NULL
FROM ordered
WHERE next_index IS NOT NULL;
