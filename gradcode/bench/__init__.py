"""Benchmarks: each prints a table and saves JSON and a PNG figure (:mod:`gradcode.bench.output`)."""
