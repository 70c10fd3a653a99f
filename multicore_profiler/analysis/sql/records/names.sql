-- Display names of records: stages, control ids, fallbacks, trace event names.
-- Needs nothing (the macros take an invocation's stage_names map).

-- hyper-parallel's names of its runtime's task types: the defaults of TaskType_<name>,
-- which a kernel's own task type names override.
CREATE OR REPLACE MACRO default_task_type_name(task_type) AS
CASE task_type
    WHEN 0 THEN 'Terminate'
    WHEN 10 THEN 'BeginTaskGraph'
    WHEN 101 THEN 'AddCustom'
    WHEN 102 THEN 'SwiGLU'
    WHEN 103 THEN 'MatMul'
    WHEN 104 THEN 'GroupedMatMul'
    WHEN 105 THEN 'ShmemPutMemSignal'
    WHEN 106 THEN 'SwiGLUGrad'
    WHEN 107 THEN 'ShmemGetMem'
END;

-- Display name of a desc id, as hyper-parallel's exporter names it: the kernel's name
-- for it; for the compute fallback 0x20000 + n, TaskType_<the kernel's name for task type
-- n (it names desc id 0x20000 + n), else the default name, else n>; the ABI's control ids
-- by their names; any other id from 0x20000 up (a stage the kernel did not name) as
-- TaskType_<id - 0x20000>; else DescId_<id>.
CREATE OR REPLACE MACRO stage_name(stage_names, desc_id) AS
CASE
    WHEN desc_id IS NULL THEN NULL
    WHEN desc_id BETWEEN 131072 AND 196607
        THEN 'TaskType_' || coalesce(
            stage_names[desc_id],
            default_task_type_name(desc_id - 131072),
            (desc_id - 131072)::VARCHAR)
    ELSE coalesce(
        stage_names[desc_id],
        CASE desc_id
            WHEN 65536 THEN 'WaitDependency'
            WHEN 65542 THEN 'TerminateTask'
            WHEN 65543 THEN 'TriggerEvent'
        END,
        CASE WHEN desc_id > 196607 THEN 'TaskType_' || (desc_id - 131072)
             ELSE 'DescId_' || desc_id END)
END;

-- Whether a desc id is a stage the kernel named: any id but WaitDependency, TriggerEvent
-- and the fallback ids (TerminateTask is the stage of a spec's terminate tasks).
CREATE OR REPLACE MACRO is_named_stage(stage_names, desc_id) AS
coalesce(
    desc_id NOT IN (65536, 65543) AND desc_id NOT BETWEEN 131072 AND 196607
    AND stage_names[desc_id] IS NOT NULL,
    false);

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

-- Display name of a core type: hyper-parallel's AIC and AIV, and the core types of other
-- profilers' imported records (SM: a GPU's streaming multiprocessor by its hardware id;
-- CTA: a thread block whose SM the producer did not record). abi.CORE_NAMES in Python.
CREATE OR REPLACE MACRO core_name(core_type) AS
CASE core_type WHEN 1 THEN 'AIC' WHEN 2 THEN 'AIV' WHEN 3 THEN 'SM' WHEN 4 THEN 'CTA' END;
