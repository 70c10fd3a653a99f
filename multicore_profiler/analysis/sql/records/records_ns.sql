-- Records with their times in ns and their stage names.
-- Needs: units, records.names, records.aligned_records.

-- Per invocation and task, the desc id of its compute record (the lowest, should it have
-- several): the stage of its wait and trigger records where the kernel handed over no
-- task graph.
CREATE OR REPLACE VIEW task_stages AS
SELECT run_id, rank, invocation_id, write_id, task_id, min(desc_id) AS stage_desc_id
FROM raw_records
WHERE phase = 'compute'
GROUP BY ALL;

-- A record's stage desc id: its own for a compute record; for a wait, trigger or
-- TerminateTask record its task's, from the task graph (graph_desc_id) or else from the
-- task's compute record (compute_desc_id, task_stages).
CREATE OR REPLACE MACRO record_stage_desc_id(phase, desc_id, graph_desc_id, compute_desc_id) AS
CASE WHEN phase = 'compute' THEN desc_id ELSE coalesce(graph_desc_id, compute_desc_id) END;

-- Records with times in ns from their invocation's anchor cycle and frequency, the
-- kernel, and the stage of the record's task: a wait or trigger record takes its
-- task's stage from the task graph where the kernel handed one over, else from the
-- task's compute record. Unnamed stages are TaskType_<n> or DescId_<id>.
CREATE OR REPLACE VIEW records_ns AS
SELECT
    r.run_id, r.step, r.rank, i.device, r.invocation_id, i.window_id, i.config_id,
    i.kernel_name, i.direction,
    r.core_type,
    core_name(r.core_type) AS core,
    r.block_id, r.record_index, r.task_id, r.desc_id, r.stage_task_index, r.owner_id,
    r.phase,
    record_stage_desc_id(r.phase, r.desc_id, g.desc_id, t.stage_desc_id) AS stage_desc_id,
    stage_name(
        i.stage_names, record_stage_desc_id(r.phase, r.desc_id, g.desc_id, t.stage_desc_id)
    ) AS stage,
    r.start_cycle, r.end_cycle,
    cycles_to_ns(r.start_cycle::HUGEINT - i.anchor_cycle, i.frequency_hz) AS ts_ns,
    cycles_to_ns(r.end_cycle - r.start_cycle, i.frequency_hz) AS dur_ns
FROM aligned_raw_records r
JOIN invocations i
    ON r.run_id = i.run_id AND r.rank = i.rank AND r.invocation_id = i.invocation_id
    AND r.write_id = i.write_id
LEFT JOIN task_stages t
    ON r.phase <> 'compute' AND t.run_id = r.run_id AND t.rank = r.rank
    AND t.invocation_id = r.invocation_id AND t.write_id = r.write_id AND t.task_id = r.task_id
LEFT JOIN tasks g
    ON r.phase <> 'compute' AND g.run_id = r.run_id AND g.rank = r.rank
    AND g.config_id = i.config_id AND g.task_id = r.task_id;
