#!/usr/bin/env bash
# `make bench`: benchmarks against plain `docker run` are tracked in their own issue and not
# written yet; say so instead of printing made-up numbers.
echo "make bench: the benchmarks (turn overhead vs docker run, ls at 1,000 sessions, RSS," >&2
echo "parsing throughput, cold start) are not implemented yet." >&2
exit 1
