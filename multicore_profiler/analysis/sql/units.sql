-- Generic unit conversions. Needs nothing.

-- Convert a cycle count (or difference) to nanoseconds at a frequency in Hz.
CREATE OR REPLACE MACRO cycles_to_ns(cycles, frequency_hz) AS cycles * 1e9 / frequency_hz;

-- A cycle as integer ns from an anchor cycle: the rounded point. A duration taken as the
-- difference of two such points adds up exactly (the timelines and the per-core
-- breakdown and critical path take every time this way).
CREATE OR REPLACE MACRO cycle_ns(cycle, anchor_cycle, frequency_hz) AS
round((cycle::HUGEINT - anchor_cycle) * (1e9 / frequency_hz))::BIGINT;
