-- What each wait waited for: the trigger that released it, and who blocks whom.
-- Needs: units, records.names, records.records_ns, records.task_edges.

-- One row per wait record, charged to the trigger record that released it (its release
-- edge in task_releases): the producer's task, stage, owner, core and record, and the
-- release latency (wait end - trigger end, ns), which measures the release only where the
-- wait waited (waited: the trigger ended after the wait began; else it was released
-- before it began and the latency is NULL). A wait of an invocation without a
-- task graph, or whose releasing trigger was not recorded, has attributed = false and no
-- producer: it is counted apart, not guessed. wait_ns and the latency are differences of
-- rounded ns points (cycle_ns).
-- A graph of recorded predecessors (task_dependencies) has no wait records: there, each
-- compute record of a task with predecessors is a consumer, its wait the gap on its core
-- before it (from its core's previous record's end, or from the invocation's first start
-- for a core's first record, to its start), charged to its last-finishing predecessor
-- (task_last_dependencies); event is NULL, waited says the predecessor ended after
-- the gap began, and the release latency is the predecessor's end to the record's start.
CREATE OR REPLACE VIEW wait_attribution AS
SELECT
    w.run_id, w.step, w.rank, w.invocation_id, w.kernel_name, w.direction,
    w.core AS consumer_core, w.core_type AS consumer_core_type,
    w.block_id AS consumer_block_id, w.record_index AS consumer_record_index,
    w.task_id AS consumer_task_id, w.stage AS consumer_stage, w.owner_id AS consumer_owner_id,
    cycle_ns(w.end_cycle, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(w.start_cycle, i.anchor_cycle, i.frequency_hz) AS wait_ns,
    e.src_task_id IS NOT NULL AS attributed,
    e.event,
    e.src_task_id AS producer_task_id,
    stage_name(i.stage_names, g.desc_id) AS producer_stage,
    g.owner_id AS producer_owner_id,
    core_name(e.src_core_type) AS producer_core,
    e.src_core_type AS producer_core_type, e.src_block_id AS producer_block_id,
    e.src_record_index AS producer_record_index,
    e.src_end_cycle >= w.start_cycle AS waited,
    CASE WHEN e.src_end_cycle >= w.start_cycle THEN
        cycle_ns(w.end_cycle, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(e.src_end_cycle, i.anchor_cycle, i.frequency_hz) END AS release_latency_ns
FROM records_ns w
JOIN invocations i
    ON w.run_id = i.run_id AND w.rank = i.rank AND w.invocation_id = i.invocation_id
LEFT JOIN task_releases e
    ON e.run_id = w.run_id AND e.rank = w.rank
    AND e.invocation_id = w.invocation_id
    AND e.dst_core_type = w.core_type AND e.dst_block_id = w.block_id
    AND e.dst_record_index = w.record_index
LEFT JOIN tasks g
    ON g.run_id = e.run_id AND g.rank = e.rank AND g.config_id = i.config_id
    AND g.task_id = e.src_task_id
WHERE w.phase = 'wait'
UNION ALL
SELECT
    w.run_id, w.step, w.rank, w.invocation_id, w.kernel_name, w.direction,
    w.core, w.core_type, w.block_id, w.record_index, w.task_id, w.stage, w.owner_id,
    cycle_ns(w.start_cycle, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(gap.begin_cycle, i.anchor_cycle, i.frequency_hz),
    true, NULL::INTEGER,
    s.task_id, s.stage, s.owner_id, s.core, s.core_type, s.block_id, s.record_index,
    h.src_end_cycle >= gap.begin_cycle,
    CASE WHEN h.src_end_cycle >= gap.begin_cycle THEN
        cycle_ns(w.start_cycle, i.anchor_cycle, i.frequency_hz)
        - cycle_ns(h.src_end_cycle, i.anchor_cycle, i.frequency_hz) END
FROM task_last_dependencies h
JOIN invocations i
    ON h.run_id = i.run_id AND h.rank = i.rank AND h.invocation_id = i.invocation_id
    AND h.write_id = i.write_id
JOIN records_ns w
    ON w.run_id = h.run_id AND w.rank = h.rank AND w.invocation_id = h.invocation_id
    AND w.core_type = h.core_type AND w.block_id = h.block_id
    AND w.record_index = h.record_index
JOIN records_ns s
    ON s.run_id = h.run_id AND s.rank = h.rank AND s.invocation_id = h.invocation_id
    AND s.core_type = h.src_core_type AND s.block_id = h.src_block_id
    AND s.record_index = h.src_record_index
CROSS JOIN LATERAL (
    SELECT coalesce(h.previous_end_cycle, (
        SELECT min(r.start_cycle) FROM aligned_records r
        WHERE r.run_id = h.run_id AND r.rank = h.rank AND r.invocation_id = h.invocation_id
            AND r.write_id = h.write_id
    )) AS begin_cycle
) gap;

-- Who blocks whom, per run, kernel and direction: the waits of each consumer stage by the
-- producer stage and core type that released them, with their total, median and 99th
-- percentile wait and release latency (ns; the latency of the waits that waited). Waits
-- without a known producer make one row per consumer stage with attributed = false.
CREATE OR REPLACE VIEW wait_blockers AS
SELECT
    run_id, kernel_name, direction, consumer_stage, producer_stage, producer_core, attributed,
    count(*) AS waits,
    sum(wait_ns)::BIGINT AS total_wait_ns,
    quantile_cont(wait_ns, 0.5) AS p50_wait_ns,
    quantile_cont(wait_ns, 0.99) AS p99_wait_ns,
    sum(release_latency_ns)::BIGINT AS total_latency_ns,
    quantile_cont(release_latency_ns, 0.5) AS p50_latency_ns,
    quantile_cont(release_latency_ns, 0.99) AS p99_latency_ns
FROM wait_attribution
GROUP BY ALL;
