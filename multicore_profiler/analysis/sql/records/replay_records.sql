-- The what-if replay's input (analysis/replay.py): every record with its cycles, its
-- invocation's anchor and frequency, and for a wait or trigger of a task in the kernel's
-- task graph its event, wait count or triggered event (NULL otherwise).
-- Needs: records.records_ns.
CREATE OR REPLACE VIEW replay_records AS
SELECT
    n.run_id, n.step, n.rank, n.invocation_id, i.write_id, n.kernel_name, n.direction,
    n.core_type, n.block_id, n.record_index, n.phase::VARCHAR AS phase, n.stage,
    n.owner_id, n.task_id, n.start_cycle::BIGINT AS start_cycle,
    n.end_cycle::BIGINT AS end_cycle, i.frequency_hz, i.anchor_cycle::BIGINT AS anchor_cycle,
    CASE WHEN n.phase = 'wait' AND g.wait_event >= 0 THEN g.wait_event END AS wait_event,
    CASE WHEN n.phase = 'wait' AND g.wait_event >= 0 THEN g.wait_count END AS wait_count,
    CASE WHEN n.phase = 'trigger' AND g.trigger_event >= 0 THEN g.trigger_event END
        AS trigger_event
FROM records_ns n
JOIN invocations i
    ON i.run_id = n.run_id AND i.rank = n.rank AND i.invocation_id = n.invocation_id
LEFT JOIN tasks g
    ON n.phase IN ('wait', 'trigger') AND g.run_id = n.run_id AND g.rank = n.rank
    AND g.config_id = n.config_id AND g.task_id = n.task_id;
