-- The store's views over its raw_<table> file views: what is committed and visible, raw
-- cycles and ids as they came. Times in ns, names and statistics are analyses
-- (multicore_profiler/analysis/sql/), installed through the registry of SQL modules.

-- One row per run: its latest state (a run's row is written again as it progresses),
-- over every rank that reports it: failed if any rank failed, else running while any
-- rank runs, else complete. Provenance comes from the lowest rank; the capture cost
-- adds up the ranks that recorded one (NULL where none did).
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
    count(*) FILTER (WHERE status = 'failed') AS ranks_failed,
    sum(capture_steps)::BIGINT AS capture_steps,
    sum(capture_job_seconds) AS capture_job_seconds,
    sum(capture_writer_cpu_seconds) AS capture_writer_cpu_seconds,
    arg_min(capture_writer, coalesce(rank, -1)) AS capture_writer
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

-- invocations (one row per kernel launch) is defined in invocations.sql, in the form the
-- discards a connection sees need (see Store._point).

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

-- One row per outer trace (torch.profiler / kineto, torch_npu) in the store: the first
-- committed ingest of the file (its sources row is written after its events). A trace
-- ingested before jobs were recorded is a job of its own, named by its source id.
CREATE OR REPLACE VIEW trace_sources AS
SELECT * REPLACE (coalesce(job_id, source_id) AS job_id) FROM raw_trace_sources
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
