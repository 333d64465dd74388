"""Shared pieces of the `wgrumus` command: the usage-error type, rank-0 output, JSON output."""
from __future__ import annotations

import json
import os
import sys


class UsageError(Exception):
    """A bad argument: `main` prints the message as one line and exits with code 2."""


def positive(kind=int, allow_zero: bool = False):
    """argparse type for sizes: argparse turns the ValueError into its own exit-2 message."""
    def parse(text: str):
        import argparse
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if v < 0 or (v == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(
                f"must be {'>= 0' if allow_zero else '> 0'}, got {text}")
        return v
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def env_rank() -> int:
    """This process's rank under mpiexec (MPICH / Open MPI / Slurm env), 0 otherwise. Read from
    the environment so that even argument errors are printed by rank 0 only."""
    for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        v = os.environ.get(k)
        if v and v.isdigit():
            return int(v)
    return 0


def is_main_rank() -> bool:
    return env_rank() == 0


def console(stderr: bool = False):
    """A rich console; quiet (writes nowhere) on ranks other than 0."""
    from rich.console import Console
    if not is_main_rank():
        return Console(file=open(os.devnull, "w"), quiet=True)
    return Console(stderr=stderr, highlight=False)


def print_json(obj) -> None:
    """Exactly one JSON document on stdout (rank 0 only)."""
    if is_main_rank():
        sys.stdout.write(json.dumps(obj, default=_default) + "\n")
        sys.stdout.flush()


def _default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
