#!/usr/bin/env python3
"""Kept for old command lines: the benchmarks are pyprefill.bench (`pyprefill bench --help`)."""
import sys

from pyprefill.bench.cli import main

sys.exit(main())
