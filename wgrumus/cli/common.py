"""Shared pieces of the `wgrumus` command: the usage-error type, the argument parser, rank-0
output, JSON output."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys


class UsageError(Exception):
    """A bad argument: `main` prints the message as one line and exits with code 2."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (plus exit code 2), printed by rank 0 only.
    Options are taken only as spelled in full: argparse's prefix matching would read a typo
    such as ``--step 5`` as ``--steps 5`` without a word."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's default prints the whole usage block first
        say_error(f"{self.prog}: error: {message} (see {self.prog} --help)")
        sys.exit(2)


def positive(kind=int, allow_zero: bool = False):
    """argparse type for sizes: argparse turns the ValueError into its own exit-2 message."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if v < 0 or (v == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(
                f"must be {'>= 0' if allow_zero else '> 0'}, got {text}")
        return v
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def env_rank() -> int:
    """This process's rank under mpiexec or a processes launch (from the environment, so
    argument errors print once)."""
    for k in ("WGRUMUS_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        v = os.environ.get(k)
        if v and v.isdigit():
            return int(v)
    return 0


def say_error(line: str) -> None:
    """One stderr line, from rank 0 only (every mpiexec rank meets the same error)."""
    if is_main_rank():
        print(line, file=sys.stderr, flush=True)


def is_main_rank() -> bool:
    return env_rank() == 0


def console(stderr: bool = False):
    """A rich console; quiet (writes nowhere) on ranks other than 0."""
    from rich.console import Console  # rich loads only when something is printed
    if not is_main_rank():
        return Console(file=open(os.devnull, "w"), quiet=True)
    return Console(stderr=stderr, highlight=False)


def print_json(obj) -> None:
    """Exactly one strict JSON document on stdout (rank 0 only; NaN and infinities as null)."""
    if is_main_rank():
        sys.stdout.write(json.dumps(finite_or_none(obj), allow_nan=False) + "\n")
        sys.stdout.flush()


def finite_or_none(obj):
    """``obj`` with every non-finite float (in dicts, lists, numpy scalars) replaced by None."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        obj = obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
