-- Communication bandwidth across the ranks of a job: communication_bandwidth, msprof's
-- "Communication Bandwidth Info" per op, rank and transport, for every rank of a job.
-- Needs: outer_kernels.hccl_ops (hccl_op_bandwidth), cross_rank.steps (job_sources: each
-- source's communication rows, parsed once).
--
-- Traced torch_npu ranks: hccl_op_bandwidth, computed from the HCCL task stream (basis
-- 'trace'). Ranks loaded without a trace: msprof's own rows of communication.json (basis
-- 'msprof'; sizes in MB are 10^6 bytes, rounded to the byte; times in ms rounded to the
-- ns). Columns as hccl_op_bandwidth's, with the job and the step number.

-- One row per (job, rank, step, group, op, transport): transit_bytes, transit_ns (over all
-- planes), bandwidth_gb_s (MB / ms, as msprof rounds it), large_packet_ratio, and
-- size_distribution (a map of packet bytes to their packets and transit ns, by size).
CREATE OR REPLACE VIEW communication_bandwidth AS
WITH traced AS (
    SELECT s.job_id, b.rank, b.step_number AS step, b.group_name, b.op_name,
        b.transport_type, b.transit_bytes, b.transit_ns, b.bandwidth_gb_s,
        b.large_packet_ratio, b.size_distribution, 'trace' AS basis
    FROM hccl_op_bandwidth b JOIN trace_sources s USING (source_id)
), ops AS (
    SELECT job_id, rank, unnest(communication) AS op
    FROM job_sources
    WHERE form = 'outputs' AND communication IS NOT NULL
), transports AS (
    SELECT job_id, rank, op, unnest(json_keys(op, '$.bandwidth')) AS transport_type
    FROM ops
), ms AS (
    SELECT job_id, rank,
        TRY_CAST(regexp_extract(op->>'step', '(\d+)$', 1) AS BIGINT) AS step,
        op->>'group_name' AS group_name, op->>'op_name' AS op_name, transport_type,
        json_extract(op, '$.bandwidth."' || transport_type || '"') AS info
    FROM transports
)
SELECT * FROM traced
UNION ALL
SELECT job_id, rank, step, group_name, op_name, transport_type,
    round(TRY_CAST(info->>'$.size_mb' AS DOUBLE) * 1e6)::BIGINT AS transit_bytes,
    round(TRY_CAST(info->>'$.time_ms' AS DOUBLE) * 1e6)::BIGINT AS transit_ns,
    TRY_CAST(info->>'$.bandwidth_gbps' AS DOUBLE) AS bandwidth_gb_s,
    TRY_CAST(info->>'$.large_packet_ratio' AS DOUBLE) AS large_packet_ratio,
    map_from_entries(list_sort(list_transform(
        json_keys(info, '$.size_distribution'),
        lambda size: {
            'key': round(TRY_CAST(size AS DOUBLE) * 1e6)::BIGINT,
            'value': {
                'packets': TRY_CAST(
                    json_extract(info, '$.size_distribution."' || size || '"[0]') AS BIGINT),
                'transit_ns': round(TRY_CAST(
                    json_extract(info, '$.size_distribution."' || size || '"[1]') AS DOUBLE)
                    * 1e6)::BIGINT
            }
        }))) AS size_distribution,
    'msprof' AS basis
FROM ms;
