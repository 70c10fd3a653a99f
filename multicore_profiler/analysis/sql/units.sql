-- Generic unit conversions. Needs nothing.

-- Convert a cycle count (or difference) to nanoseconds at a frequency in Hz.
CREATE OR REPLACE MACRO cycles_to_ns(cycles, frequency_hz) AS cycles * 1e9 / frequency_hz;
