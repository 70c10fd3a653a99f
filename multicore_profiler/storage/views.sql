-- Named views and macros over the store's raw_<table> file views.
-- Raw cycles and ids come from the files; times in ns and names are derived here.

-- Convert a cycle count (or difference) to nanoseconds at a frequency in Hz.
CREATE OR REPLACE MACRO cycles_to_ns(cycles, frequency_hz) AS cycles * 1e9 / frequency_hz;

-- Display name of a desc id: the kernel's name for it; for the compute fallback
-- 0x20000 + n, TaskType_<the kernel's name for task type n, else n> (a kernel names task
-- type n by naming desc id 0x20000 + n); the ABI's control ids by their names; else
-- DescId_<id>.
CREATE OR REPLACE MACRO stage_name(stage_names, desc_id) AS
CASE
    WHEN desc_id IS NULL THEN NULL
    WHEN desc_id BETWEEN 131072 AND 196607
        THEN 'TaskType_' || coalesce(stage_names[desc_id], (desc_id - 131072)::VARCHAR)
    ELSE coalesce(
        stage_names[desc_id],
        CASE desc_id
            WHEN 65536 THEN 'WaitDependency'
            WHEN 65542 THEN 'TerminateTask'
            WHEN 65543 THEN 'TriggerEvent'
        END,
        'DescId_' || desc_id)
END;

-- Whether a desc id is a stage the kernel named (not a control or fallback id).
CREATE OR REPLACE MACRO is_named_stage(stage_names, desc_id) AS
coalesce(desc_id NOT BETWEEN 65536 AND 196607 AND stage_names[desc_id] IS NOT NULL, false);

-- Display name of a record in a trace (the rules of hyper-parallel's exporter): its stage
-- name; a WaitDependency or TriggerEvent record takes the stage of its task as a prefix
-- when the kernel named that stage (GMM1_WaitDependency); detailed names add the owner
-- (unless 0xFFFFFFFF, none) and the task's number within its stage:
-- <owner_label><owner_id>_<name>_task<stage_task_index + 1>.
CREATE OR REPLACE MACRO event_name(
    stage_names, owner_label, desc_id, task_stage, owner_id, stage_task_index, detailed
) AS
CASE WHEN detailed AND owner_id <> 4294967295
     THEN coalesce(owner_label, 'Owner') || owner_id || '_' ELSE '' END
|| CASE WHEN desc_id IN (65536, 65543) AND is_named_stage(stage_names, task_stage)
        THEN stage_names[task_stage] || '_' ELSE '' END
|| stage_name(stage_names, desc_id)
|| CASE WHEN detailed THEN '_task' || (stage_task_index + 1) ELSE '' END;

-- One row per run: its latest state (a run's row is written again as it progresses),
-- over every rank that reports it: failed if any rank failed, else running while any
-- rank runs, else complete. Provenance comes from the lowest rank.
CREATE OR REPLACE VIEW runs AS
WITH latest AS (
    SELECT * FROM raw_runs
    QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY updated_at DESC) = 1
)
SELECT
    run_id,
    max(updated_at) AS updated_at,
    min(start_time) AS start_time,
    CASE WHEN bool_or(end_time IS NULL) THEN NULL ELSE max(end_time) END AS end_time,
    CASE
        WHEN bool_or(status = 'failed') THEN 'failed'
        WHEN bool_or(status = 'running') THEN 'running'
        ELSE 'complete'
    END AS status,
    arg_min(commit, coalesce(rank, -1)) AS commit,
    arg_min(branch, coalesce(rank, -1)) AS branch,
    arg_min(label, coalesce(rank, -1)) AS label,
    arg_min(host, coalesce(rank, -1)) AS host,
    arg_min(versions, coalesce(rank, -1)) AS versions,
    arg_min(schedule, coalesce(rank, -1)) AS schedule,
    arg_min(tags, coalesce(rank, -1)) AS tags,
    count(*) AS ranks_reporting,
    count(*) FILTER (WHERE status = 'failed') AS ranks_failed
FROM latest
GROUP BY run_id;

-- One row per write a compaction of a remote store rewrote, by origin (the write as its
-- writer made it): the rewrite that shows, of the highest (generation, write id) that a
-- supersession in discards names.
CREATE OR REPLACE VIEW current_rewrite AS
SELECT run_id, rank, origin_write_id,
    arg_max(replaced_by, {'generation': generation, 'write_id': replaced_by}) AS write_id
FROM raw_discards
WHERE replaced_by IS NOT NULL
GROUP BY ALL;

-- One row per kernel launch. An invocation's row is written after its cores and
-- records, so it is what makes them visible; a discarded write hides it again, with
-- any rewrite of it. A writer's row shows while no discard or supersession names its
-- write; a compaction's rewritten row shows while it is its origin's current rewrite.
-- (Two branches rather than one left join: DuckDB plans the records join of each
-- about twice as fast.)
CREATE OR REPLACE VIEW invocations AS
SELECT i.* FROM raw_invocations i
ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank
    AND i.write_id = coalesce(d.origin_write_id, d.write_id)
WHERE i.origin_write_id IS NULL
UNION ALL
SELECT i.* FROM raw_invocations i
JOIN current_rewrite w ON i.run_id = w.run_id AND i.rank = w.rank AND i.write_id = w.write_id
ANTI JOIN raw_discards d
    ON i.run_id = d.run_id AND i.rank = d.rank AND d.replaced_by IS NULL
    AND i.origin_write_id = d.write_id
WHERE i.origin_write_id IS NOT NULL;

-- One row per slot that was not idle, of committed invocations only. (An inner join, not
-- a semi join: a committed invocation is one row, and a filter on the run or step then
-- reaches both sides, so neither reads another run's files.)
CREATE OR REPLACE VIEW cores AS
SELECT c.* FROM raw_cores c
JOIN invocations i
    ON c.run_id = i.run_id AND c.rank = i.rank AND c.invocation_id = i.invocation_id
    AND c.write_id = i.write_id;

-- One row per device record, raw, of committed invocations only (an inner join, as above).
CREATE OR REPLACE VIEW records AS
SELECT r.* FROM raw_records r
JOIN invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id;

-- One row per task of a kernel's task graph, per run, rank and config (a graph
-- written twice by a retry counts once).
CREATE OR REPLACE VIEW tasks AS
SELECT * FROM raw_tasks
QUALIFY row_number() OVER (PARTITION BY run_id, rank, config_id, task_id) = 1;

-- Records with times in ns from their invocation's anchor cycle and frequency, the
-- kernel, and the stage of the record's task: a wait or trigger record takes its
-- task's stage from the task graph where the kernel handed one over, else from the
-- task's compute record. Unnamed stages are TaskType_<n> or DescId_<id>.
CREATE OR REPLACE VIEW records_ns AS
WITH task_stage AS (
    SELECT run_id, rank, invocation_id, write_id, task_id, min(desc_id) AS stage_desc_id
    FROM raw_records
    WHERE phase = 'compute'
    GROUP BY ALL
)
SELECT
    r.run_id, r.step, r.rank, i.device, r.invocation_id, i.window_id, i.config_id,
    i.kernel_name, i.direction,
    r.core_type,
    CASE r.core_type WHEN 1 THEN 'AIC' WHEN 2 THEN 'AIV' END AS core,
    r.block_id, r.record_index, r.task_id, r.desc_id, r.stage_task_index, r.owner_id,
    r.phase,
    CASE WHEN r.phase = 'compute' THEN r.desc_id
         ELSE coalesce(g.desc_id, t.stage_desc_id) END AS stage_desc_id,
    stage_name(
        i.stage_names,
        CASE WHEN r.phase = 'compute' THEN r.desc_id ELSE coalesce(g.desc_id, t.stage_desc_id) END
    ) AS stage,
    r.start_cycle, r.end_cycle,
    cycles_to_ns(r.start_cycle::HUGEINT - i.anchor_cycle, i.frequency_hz) AS ts_ns,
    cycles_to_ns(r.end_cycle - r.start_cycle, i.frequency_hz) AS dur_ns
FROM raw_records r
JOIN invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id
LEFT JOIN task_stage t
    ON r.phase <> 'compute' AND t.run_id = r.run_id AND t.rank = r.rank
    AND t.invocation_id = r.invocation_id AND t.write_id = r.write_id AND t.task_id = r.task_id
LEFT JOIN tasks g
    ON r.phase <> 'compute' AND g.run_id = r.run_id AND g.rank = r.rank
    AND g.config_id = i.config_id AND g.task_id = r.task_id;

-- Records each stage should have written, per run, kernel and direction, from the task
-- graphs of the invocations whose kernel handed one over: a compute record per task,
-- plus one per event it waits on and one per event it triggers.
CREATE OR REPLACE VIEW stage_expected AS
SELECT
    i.run_id, i.kernel_name, i.direction, g.desc_id AS stage_desc_id,
    stage_name(i.stage_names, g.desc_id) AS stage,
    sum(1 + (g.wait_event >= 0)::INT + (g.trigger_event >= 0)::INT)::BIGINT AS expected_records
FROM invocations i
JOIN tasks g ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id
GROUP BY ALL;

-- Per run, kernel, direction and stage: task count, compute and wait times (us), and,
-- where the task graph is known, the records expected and how many the device dropped
-- (counted over the invocations that have a task graph only).
CREATE OR REPLACE VIEW stage_stats AS
WITH measured AS (
    SELECT
        run_id, kernel_name, direction, stage_desc_id, stage,
        count(*) AS records,
        count(*) FILTER (WHERE config_id IS NOT NULL) AS graphed_records,
        count(*) FILTER (WHERE phase = 'compute') AS tasks,
        sum(dur_ns) FILTER (WHERE phase = 'compute') / 1e3 AS compute_total_us,
        quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p50_us,
        quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'compute') / 1e3 AS compute_p99_us,
        quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p50_us,
        quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'wait') / 1e3 AS wait_p99_us
    FROM records_ns
    GROUP BY ALL
)
SELECT
    coalesce(m.run_id, e.run_id) AS run_id,
    coalesce(m.kernel_name, e.kernel_name) AS kernel_name,
    coalesce(m.direction, e.direction) AS direction,
    coalesce(m.stage_desc_id, e.stage_desc_id) AS stage_desc_id,
    coalesce(m.stage, e.stage) AS stage,
    coalesce(m.records, 0) AS records,
    coalesce(m.tasks, 0) AS tasks,
    m.compute_total_us, m.compute_p50_us, m.compute_p99_us, m.wait_p50_us, m.wait_p99_us,
    e.expected_records,
    e.expected_records - coalesce(m.graphed_records, 0) AS dropped
FROM measured m
FULL JOIN stage_expected e
    ON m.run_id = e.run_id AND m.kernel_name = e.kernel_name AND m.direction = e.direction
    AND m.stage_desc_id IS NOT DISTINCT FROM e.stage_desc_id
    AND m.stage IS NOT DISTINCT FROM e.stage;

-- One row per run with what it holds: invocations, ranks, steps, records, dropped.
CREATE OR REPLACE VIEW run_summary AS
SELECT
    r.run_id, r.status, r.label, r.commit, r.branch, r.host, r.start_time, r.end_time,
    count(i.invocation_id) AS invocations,
    count(DISTINCT i.rank) AS ranks,
    count(DISTINCT i.step) AS steps,
    coalesce(sum(i.record_count), 0)::BIGINT AS records,
    coalesce(sum(i.dropped_count), 0)::BIGINT AS dropped,
    string_agg(DISTINCT i.kernel_name, ', ' ORDER BY i.kernel_name) AS kernels
FROM runs r
LEFT JOIN invocations i ON i.run_id = r.run_id
GROUP BY ALL;

-- One row per outer trace (torch.profiler / kineto, torch_npu) in the store: the first
-- committed ingest of the file (its sources row is written after its events).
CREATE OR REPLACE VIEW trace_sources AS
SELECT * FROM raw_trace_sources
QUALIFY row_number() OVER (PARTITION BY source_id ORDER BY ingested_at, write_id) = 1;

-- Whether an outer-trace event is device activity: a kernel, memcpy or memset (kineto's
-- categories) or a device task (torch_npu's carry a Task Type).
CREATE OR REPLACE MACRO is_device_op(cat, task_type) AS
coalesce(cat IN ('kernel', 'gpu_memcpy', 'gpu_memset'), false) OR task_type IS NOT NULL;

-- Whether an outer-trace event happened on the host: neither device activity nor the copy
-- of an annotation that kineto draws on the GPU (gpu_user_annotation).
CREATE OR REPLACE MACRO is_host_event(cat, task_type) AS
NOT is_device_op(cat, task_type) AND coalesce(cat, '') <> 'gpu_user_annotation';

-- Events of the outer traces, of committed ingests only, with their source's rank.
-- ts_ns and dur_ns are exact integer nanoseconds; args is the JSON text as written.
CREATE OR REPLACE VIEW trace_events AS
SELECT e.* EXCLUDE (write_id), s.rank
FROM raw_trace_events e JOIN trace_sources s USING (source_id, write_id);
