-- The store's committed rows and per-stage statistics in Spark SQL, over the raw_<table>
-- temporary views that storage.spark registers. The same rules as views.sql: a step's
-- cores and records count once its invocations are written; a discarded write hides
-- them; a compaction's rewrite replaces its origin; a wait or trigger record takes its
-- task's stage.

CREATE OR REPLACE TEMPORARY VIEW current_rewrite AS
SELECT run_id, rank, origin_write_id,
    max_by(replaced_by, struct(generation, replaced_by)) AS write_id
FROM raw_discards
WHERE replaced_by IS NOT NULL
GROUP BY run_id, rank, origin_write_id;

CREATE OR REPLACE TEMPORARY VIEW invocations AS
SELECT i.* FROM raw_invocations i
LEFT ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank
    AND i.write_id = coalesce(d.origin_write_id, d.write_id)
WHERE i.origin_write_id IS NULL
UNION ALL
SELECT i.* FROM raw_invocations i
LEFT SEMI JOIN current_rewrite w
    ON i.run_id = w.run_id AND i.rank = w.rank AND i.write_id = w.write_id
LEFT ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank AND d.replaced_by IS NULL
    AND i.origin_write_id = d.write_id
WHERE i.origin_write_id IS NOT NULL;

CREATE OR REPLACE TEMPORARY VIEW records AS
SELECT r.* FROM raw_records r
LEFT SEMI JOIN invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id;

CREATE OR REPLACE TEMPORARY VIEW tasks AS
SELECT DISTINCT run_id, rank, config_id, task_id, desc_id FROM raw_tasks;

CREATE OR REPLACE TEMPORARY VIEW records_ns AS
WITH task_stage AS (
    SELECT run_id, rank, invocation_id, write_id, task_id, min(desc_id) AS stage_desc_id
    FROM raw_records WHERE phase = 'compute' GROUP BY run_id, rank, invocation_id, write_id, task_id
),
staged AS (
    SELECT r.*, i.kernel_name, i.direction, i.stage_names, i.config_id, i.anchor_cycle,
        i.frequency_hz,
        CASE WHEN r.phase = 'compute' THEN r.desc_id
             ELSE coalesce(g.desc_id, t.stage_desc_id) END AS stage_desc_id
    FROM raw_records r
    JOIN invocations i
        ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
        AND r.write_id = i.write_id
    LEFT JOIN task_stage t
        ON r.phase <> 'compute' AND t.run_id = r.run_id AND t.rank = r.rank
        AND t.invocation_id = r.invocation_id AND t.write_id = r.write_id
        AND t.task_id = r.task_id
    LEFT JOIN tasks g
        ON r.phase <> 'compute' AND g.run_id = r.run_id AND g.rank = r.rank
        AND g.config_id = i.config_id AND g.task_id = r.task_id
)
SELECT
    run_id, step, rank, invocation_id, kernel_name, direction, config_id, core_type, block_id,
    record_index, task_id, desc_id, stage_task_index, owner_id, phase, stage_desc_id,
    CASE
        WHEN stage_desc_id IS NULL THEN NULL
        WHEN stage_desc_id BETWEEN 131072 AND 196607
            THEN 'TaskType_' || coalesce(
                try_element_at(stage_names, stage_desc_id),
                CASE stage_desc_id - 131072
                    WHEN 0 THEN 'Terminate'
                    WHEN 10 THEN 'BeginTaskGraph'
                    WHEN 101 THEN 'AddCustom'
                    WHEN 102 THEN 'SwiGLU'
                    WHEN 103 THEN 'MatMul'
                    WHEN 104 THEN 'GroupedMatMul'
                    WHEN 105 THEN 'ShmemPutMemSignal'
                    WHEN 106 THEN 'SwiGLUGrad'
                    WHEN 107 THEN 'ShmemGetMem'
                END,
                CAST(stage_desc_id - 131072 AS STRING))
        ELSE coalesce(
            try_element_at(stage_names, stage_desc_id),
            CASE stage_desc_id
                WHEN 65536 THEN 'WaitDependency'
                WHEN 65542 THEN 'TerminateTask'
                WHEN 65543 THEN 'TriggerEvent'
            END,
            CASE WHEN stage_desc_id > 196607
                THEN 'TaskType_' || CAST(stage_desc_id - 131072 AS STRING)
                ELSE 'DescId_' || CAST(stage_desc_id AS STRING) END)
    END AS stage,
    start_cycle, end_cycle,
    CAST(start_cycle - anchor_cycle AS DOUBLE) * 1e9 / frequency_hz AS ts_ns,
    CAST(end_cycle - start_cycle AS DOUBLE) * 1e9 / frequency_hz AS dur_ns
FROM staged;

-- Per run, kernel, direction and stage: the measured columns of DuckDB's stage_stats.
CREATE OR REPLACE TEMPORARY VIEW stage_totals AS
SELECT
    run_id, kernel_name, direction, stage_desc_id, stage,
    count(*) AS records,
    count(*) FILTER (WHERE phase = 'compute') AS tasks,
    sum(dur_ns) FILTER (WHERE phase = 'compute') / 1e3 AS compute_total_us,
    percentile(dur_ns, 0.5) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p50_us,
    percentile(dur_ns, 0.99) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p99_us,
    percentile(dur_ns, 0.5) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p50_us,
    percentile(dur_ns, 0.99) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p99_us
FROM records_ns
GROUP BY run_id, kernel_name, direction, stage_desc_id, stage
