-- Schedule sanity: the recorded tasks of each worker against its planned queue, and each
-- wait's event count against its triggers (docs/clocks.md).
-- Needs: records.names (core_name). It reads the store's tables as recorded (tasks,
-- invocations, cores, raw_records): counts and orders, no cycles, so no clock alignment.
--
-- The plan. An invocation is judged where its kernel handed over a planned schedule: a
-- task graph (tasks, per run, rank and config_id) whose tasks list no recorded
-- predecessors (depends_on NULL: mcprof's own RuntimeConfig graphs). A worker's queue is
-- the tasks of its core type and worker, in task id order (the kernel builds each queue
-- so and the worker runs it in order: kernels/runtime.py, the reference kernel's
-- queues(), the device recorder's RunWorker). Worker w of a core type records into that
-- core type's slot w, whose block_id is w (the slot index is the block id: the device
-- recorder's Init(worker_id) writes block_id = worker_id; the reference kernel runs
-- worker w as block w). Invocations without a task graph, and those of an imported
-- dependency graph (simpler's, which files each task under the core that ran it rather
-- than planning it), have no rows.
--
-- The record. A task leaves a wait record (if it waits), its own record (its compute: its
-- stage or fallback desc id, phase 'compute'; a TerminateTask task's, phase 'terminate')
-- and a trigger record (if it triggers). A task counts as recorded on a slot by its own
-- record: every desc id but WaitDependency (0x10000) and TriggerEvent (0x10007). A
-- slot's recorded order is its record index order.

-- The invocations judged: those of a planned task graph, with their config.
CREATE OR REPLACE VIEW _scheduled_invocations AS
WITH planned_graphs AS (
    SELECT run_id, rank, config_id FROM tasks GROUP BY ALL HAVING count(depends_on) = 0
)
SELECT i.run_id, i.step, i.rank, i.invocation_id, i.write_id, i.config_id
FROM invocations i
JOIN planned_graphs g
    ON g.run_id = i.run_id AND g.rank = i.rank AND g.config_id = i.config_id;

-- Each planned task of a judged invocation in its worker's queue: the slot it records into
-- (core_type, block_id = its worker) and its position in the queue (0: the first).
CREATE OR REPLACE VIEW _schedule_queue AS
WITH queued AS (
    SELECT
        run_id, rank, config_id, core_type, worker AS block_id, task_id,
        row_number() OVER (
            PARTITION BY run_id, rank, config_id, core_type, worker ORDER BY task_id
        ) - 1 AS position
    FROM tasks
)
SELECT
    s.run_id, s.step, s.rank, s.invocation_id, s.write_id,
    q.core_type, q.block_id, q.task_id, q.position
FROM _scheduled_invocations s
JOIN queued q ON q.run_id = s.run_id AND q.rank = s.rank AND q.config_id = s.config_id;

-- Each task's own record on a slot of a judged invocation, in record order: the task's
-- position in this slot's queue (NULL: not queued on this worker), its occurrence on the
-- slot (1: its first record of the task, 2: the task ran again, ...) and, for a queued
-- task's first record, the position of the queued task recorded before it on the slot
-- (NULL: none was).
CREATE OR REPLACE VIEW _schedule_recorded AS
WITH own AS (
    SELECT
        r.run_id, s.step, r.rank, r.invocation_id, r.write_id, r.core_type, r.block_id,
        r.record_index, r.task_id,
        row_number() OVER (
            PARTITION BY r.run_id, r.rank, r.invocation_id, r.write_id, r.core_type,
                r.block_id, r.task_id
            ORDER BY r.record_index
        ) AS occurrence
    FROM raw_records r
    JOIN _scheduled_invocations s
        ON s.run_id = r.run_id AND s.rank = r.rank AND s.invocation_id = r.invocation_id
        AND s.write_id = r.write_id
    WHERE r.desc_id NOT IN (65536, 65543)  -- WaitDependency, TriggerEvent
),
placed AS (
    SELECT o.*, q.position, o.occurrence = 1 AND q.position IS NOT NULL AS first_queued
    FROM own o
    LEFT JOIN _schedule_queue q
        ON q.run_id = o.run_id AND q.rank = o.rank AND q.invocation_id = o.invocation_id
        AND q.write_id = o.write_id AND q.core_type = o.core_type
        AND q.block_id = o.block_id AND q.task_id = o.task_id
)
SELECT
    * EXCLUDE (first_queued),
    CASE WHEN first_queued THEN lag(position) OVER (
        PARTITION BY run_id, rank, invocation_id, write_id, core_type, block_id, first_queued
        ORDER BY record_index
    ) END AS previous_position
FROM placed;

-- One row per fault of a slot's schedule, the task (and record) at fault:
-- * missing: a queued task with no record of its own on the slot (record_index NULL);
-- * extra: the first record of a task not in the slot's queue (position NULL);
-- * repeated: each further record of a task the slot already recorded (run again);
-- * out_of_order: the first record of a queued task that comes right after (among the
--   slot's first records of queued tasks) a task queued after it; previous_position is
--   that task's position.
CREATE OR REPLACE VIEW schedule_faults AS
SELECT
    run_id, rank, invocation_id, core_type, block_id, 'missing' AS fault, task_id,
    position, NULL::UINTEGER AS record_index, NULL::BIGINT AS previous_position,
    step, core_name(core_type) AS core
FROM _schedule_queue q
ANTI JOIN _schedule_recorded r
    ON r.run_id = q.run_id AND r.rank = q.rank AND r.invocation_id = q.invocation_id
    AND r.write_id = q.write_id AND r.core_type = q.core_type AND r.block_id = q.block_id
    AND r.task_id = q.task_id
UNION ALL
SELECT
    run_id, rank, invocation_id, core_type, block_id,
    CASE
        WHEN occurrence > 1 THEN 'repeated'
        WHEN position IS NULL THEN 'extra'
        ELSE 'out_of_order'
    END,
    task_id, position, record_index, previous_position, step, core_name(core_type)
FROM _schedule_recorded
WHERE occurrence > 1 OR position IS NULL OR position < previous_position;

-- Per slot of a judged invocation (each worker with a queue, and each slot that recorded):
-- * planned: the tasks in the worker's queue;
-- * recorded: the slot's own records of tasks (see above), whatever their task;
-- * missing: queued tasks with no record of their own on the slot;
-- * extra: tasks recorded on the slot that are not in its queue (a task planned on another
--   worker, or on none), each counted once;
-- * repeated: the records of a task beyond its first on the slot (a task run twice counts
--   1), of queued and other tasks alike; so recorded = planned - missing + extra + repeated;
-- * out_of_order: the first records of queued tasks that come right after a record of a
--   task queued later (adjacent pairs, among the slot's first records of queued tasks in
--   record order, whose queue positions decrease): two swapped tasks count 1, a task
--   moved ahead of k others 1, a queue run backwards its length - 1;
-- * tail_missing: the queued tasks after the last one the slot recorded (all of them
--   where it recorded none): missing tasks at the end of the queue;
-- * dropped: the slot's dropped_count (records it did not write for want of room);
-- * verdict: the first that applies of repeated, extra, out_of_order, missing (missing
--   tasks the drop does not explain), dropped (the slot dropped records, and every missing
--   task is one of the queue's tail_missing, and no more tasks are missing than records
--   were dropped: a full slot writes nothing after its first drop) and ok.
CREATE OR REPLACE VIEW schedule_sanity AS
WITH planned AS (
    SELECT run_id, rank, invocation_id, write_id, core_type, block_id, count(*) AS planned
    FROM _schedule_queue
    GROUP BY ALL
),
recorded AS (
    SELECT
        run_id, rank, invocation_id, write_id, core_type, block_id,
        count(*) AS recorded,
        count(*) FILTER (WHERE occurrence = 1 AND position IS NOT NULL) AS done,
        count(*) FILTER (WHERE occurrence = 1 AND position IS NULL) AS extra,
        count(*) FILTER (WHERE occurrence > 1) AS repeated,
        count(*) FILTER (WHERE position < previous_position) AS out_of_order,
        max(position) AS last_position
    FROM _schedule_recorded
    GROUP BY ALL
),
slots AS (
    SELECT run_id, rank, invocation_id, write_id, core_type, block_id FROM planned
    UNION
    SELECT run_id, rank, invocation_id, write_id, core_type, block_id FROM recorded
    UNION
    SELECT c.run_id, c.rank, c.invocation_id, c.write_id, c.core_type, c.block_id
    FROM cores c
    SEMI JOIN _scheduled_invocations s
        ON s.run_id = c.run_id AND s.rank = c.rank AND s.invocation_id = c.invocation_id
        AND s.write_id = c.write_id
),
counted AS (
    SELECT
        k.run_id, s.step, k.rank, k.invocation_id, k.core_type, k.block_id,
        coalesce(p.planned, 0) AS planned,
        coalesce(r.recorded, 0) AS recorded,
        coalesce(p.planned, 0) - coalesce(r.done, 0) AS missing,
        coalesce(r.extra, 0) AS extra,
        coalesce(r.repeated, 0) AS repeated,
        coalesce(r.out_of_order, 0) AS out_of_order,
        coalesce(p.planned, 0) - coalesce(r.last_position + 1, 0) AS tail_missing,
        coalesce(c.dropped_count, 0)::BIGINT AS dropped
    FROM slots k
    JOIN _scheduled_invocations s
        ON s.run_id = k.run_id AND s.rank = k.rank AND s.invocation_id = k.invocation_id
        AND s.write_id = k.write_id
    LEFT JOIN planned p
        ON p.run_id = k.run_id AND p.rank = k.rank AND p.invocation_id = k.invocation_id
        AND p.write_id = k.write_id AND p.core_type = k.core_type AND p.block_id = k.block_id
    LEFT JOIN recorded r
        ON r.run_id = k.run_id AND r.rank = k.rank AND r.invocation_id = k.invocation_id
        AND r.write_id = k.write_id AND r.core_type = k.core_type AND r.block_id = k.block_id
    LEFT JOIN cores c
        ON c.run_id = k.run_id AND c.rank = k.rank AND c.invocation_id = k.invocation_id
        AND c.write_id = k.write_id AND c.core_type = k.core_type AND c.block_id = k.block_id
)
SELECT
    run_id, rank, invocation_id, core_type, block_id,
    planned, recorded, missing, extra, repeated, out_of_order, dropped,
    CASE
        WHEN repeated > 0 THEN 'repeated'
        WHEN extra > 0 THEN 'extra'
        WHEN out_of_order > 0 THEN 'out_of_order'
        WHEN missing > 0 AND (dropped = 0 OR missing > tail_missing OR missing > dropped)
            THEN 'missing'
        WHEN dropped > 0 THEN 'dropped'
        ELSE 'ok'
    END AS verdict,
    step, core_name(core_type) AS core, tail_missing
FROM counted
ORDER BY run_id, rank, invocation_id, core_type, block_id;

-- Per judged invocation and event that a task of its graph waits on or triggers:
-- * planned_triggers: the tasks whose trigger_event it is;
-- * recorded_triggers: the TriggerEvent records of those tasks (whatever their slot);
-- * waiters: the tasks that wait on it; waits: their WaitDependency records;
-- * max_wait_count: the largest wait_count of its recorded waits (NULL: none recorded);
-- * unreleased_waits: recorded waits whose wait_count exceeds recorded_triggers: a wait
--   that ended although fewer triggers than it waits for were recorded (the waits that
--   task_releases gives no releasing trigger);
-- * trigger_dropped: the records dropped by the slots of the workers its triggering tasks
--   are queued on (what may have held its missing trigger records);
-- * verdict: the first that applies of unreleased (unreleased waits and no trigger
--   dropped: a contradiction), extra_triggers (more trigger records than planned: a task
--   triggered twice), missing_triggers (fewer, none dropped), dropped (fewer trigger
--   records, or unreleased waits, where their slots dropped records) and ok.
CREATE OR REPLACE VIEW event_sanity AS
WITH roles AS (
    SELECT run_id, rank, config_id, trigger_event AS event, true AS triggers,
        core_type, worker, NULL::UINTEGER AS wait_count
    FROM tasks
    WHERE trigger_event >= 0
    UNION ALL
    SELECT run_id, rank, config_id, wait_event, false, core_type, worker, wait_count
    FROM tasks
    WHERE wait_event >= 0
),
planned AS (
    SELECT
        s.run_id, s.step, s.rank, s.invocation_id, s.write_id, g.event,
        count(*) FILTER (WHERE g.triggers) AS planned_triggers,
        count(*) FILTER (WHERE NOT g.triggers) AS waiters
    FROM _scheduled_invocations s
    JOIN roles g ON g.run_id = s.run_id AND g.rank = s.rank AND g.config_id = s.config_id
    GROUP BY ALL
),
trigger_slots AS (
    SELECT s.run_id, s.rank, s.invocation_id, s.write_id, g.event,
        sum(c.dropped_count)::BIGINT AS trigger_dropped
    FROM _scheduled_invocations s
    JOIN (SELECT DISTINCT run_id, rank, config_id, event, core_type, worker
          FROM roles WHERE triggers) g
        ON g.run_id = s.run_id AND g.rank = s.rank AND g.config_id = s.config_id
    JOIN cores c
        ON c.run_id = s.run_id AND c.rank = s.rank AND c.invocation_id = s.invocation_id
        AND c.write_id = s.write_id AND c.core_type = g.core_type AND c.block_id = g.worker
    GROUP BY ALL
),
controls AS (
    SELECT
        r.run_id, r.rank, r.invocation_id, r.write_id, r.desc_id,
        CASE r.desc_id WHEN 65543 THEN g.trigger_event ELSE g.wait_event END AS event,
        g.wait_count
    FROM raw_records r
    JOIN _scheduled_invocations s
        ON s.run_id = r.run_id AND s.rank = r.rank AND s.invocation_id = r.invocation_id
        AND s.write_id = r.write_id
    JOIN tasks g
        ON g.run_id = r.run_id AND g.rank = r.rank AND g.config_id = s.config_id
        AND g.task_id = r.task_id
    WHERE r.desc_id IN (65536, 65543)  -- WaitDependency, TriggerEvent
),
triggered AS (
    SELECT run_id, rank, invocation_id, write_id, event, count(*) AS recorded_triggers
    FROM controls
    WHERE desc_id = 65543 AND event >= 0
    GROUP BY ALL
),
counted AS (
    SELECT
        p.run_id, p.step, p.rank, p.invocation_id, p.event,
        p.planned_triggers,
        coalesce(t.recorded_triggers, 0) AS recorded_triggers,
        p.waiters,
        count(w.event) AS waits,
        max(w.wait_count) AS max_wait_count,
        count(*) FILTER (WHERE w.wait_count > coalesce(t.recorded_triggers, 0))
            AS unreleased_waits,
        coalesce(any_value(d.trigger_dropped), 0) AS trigger_dropped
    FROM planned p
    LEFT JOIN triggered t
        ON t.run_id = p.run_id AND t.rank = p.rank AND t.invocation_id = p.invocation_id
        AND t.write_id = p.write_id AND t.event = p.event
    LEFT JOIN trigger_slots d
        ON d.run_id = p.run_id AND d.rank = p.rank AND d.invocation_id = p.invocation_id
        AND d.write_id = p.write_id AND d.event = p.event
    LEFT JOIN controls w
        ON w.run_id = p.run_id AND w.rank = p.rank AND w.invocation_id = p.invocation_id
        AND w.write_id = p.write_id AND w.event = p.event AND w.desc_id = 65536
    GROUP BY p.run_id, p.step, p.rank, p.invocation_id, p.write_id, p.event,
        p.planned_triggers, t.recorded_triggers, p.waiters
)
SELECT
    run_id, rank, invocation_id, event,
    planned_triggers, recorded_triggers, waiters, waits, max_wait_count, unreleased_waits,
    trigger_dropped,
    CASE
        WHEN unreleased_waits > 0 AND trigger_dropped = 0 THEN 'unreleased'
        WHEN recorded_triggers > planned_triggers THEN 'extra_triggers'
        WHEN recorded_triggers < planned_triggers AND trigger_dropped = 0
            THEN 'missing_triggers'
        WHEN recorded_triggers < planned_triggers OR unreleased_waits > 0 THEN 'dropped'
        ELSE 'ok'
    END AS verdict,
    step
FROM counted
ORDER BY run_id, rank, invocation_id, event;
