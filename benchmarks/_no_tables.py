"""train_step.py with the per-adapter kernel tables emptied (every GPU on the default matmul and
row-op kernels): the same-session A/B for the tables of kernels/matmul_gpu.py and
kernels/rows_gpu.py.

    python benchmarks/_no_tables.py [train_step.py arguments]
"""
import importlib
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
importlib.import_module("wgrumus.kernels.matmul_gpu").MATMUL_TABLE.clear()
importlib.import_module("wgrumus.kernels.rows_gpu").ROW_TABLE.clear()
sys.argv = [os.path.join(os.path.dirname(__file__), "train_step.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
