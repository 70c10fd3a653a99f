-- The task DAG's edges, per invocation (see DESIGN.md, "The task DAG"), one row each:
-- * release: a wait record (dst) and the trigger record (src) that released it: the
--   wait_count-th TriggerEvent of the wait's wait_event, ordered by end cycle (then
--   start cycle, task id), among the records of its invocation. Only invocations whose
--   kernel handed over its task graph (tasks) have them.
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
        g.wait_event, g.wait_count, g.trigger_event
    -- aligned_raw_records joined to invocations is aligned_records, with each record's
    -- config.
    FROM aligned_raw_records r
    JOIN invocations i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    JOIN tasks g
        ON g.run_id = r.run_id AND g.rank = r.rank AND g.config_id = i.config_id
        AND g.task_id = r.task_id
    WHERE r.desc_id IN (65536, 65543)  -- WaitDependency, TriggerEvent
),
triggers AS (
    SELECT
        *,
        row_number() OVER (
            PARTITION BY run_id, rank, invocation_id, write_id, trigger_event
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
    ON t.run_id = w.run_id AND t.rank = w.rank AND t.invocation_id = w.invocation_id
    AND t.write_id = w.write_id AND t.trigger_event = w.wait_event AND t.nth = w.wait_count;

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
SELECT
    run_id, step, rank, invocation_id, write_id, 'core_order',
    core_type, block_id, record_index, task_id, start_cycle, end_cycle,
    core_type, block_id, next_index, next_task_id, next_start_cycle, next_end_cycle,
    NULL
FROM ordered
WHERE next_index IS NOT NULL;
