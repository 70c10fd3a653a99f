-- Display names of records: stages, control ids, fallbacks, trace event names.
-- Needs nothing (the macros take an invocation's stage_names map).

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
