"""The `wgrumus` command: devices | train | bench | demo, each a module with ``add_parser(sub)``
and ``run(args) -> int``. Exit 2 for bad arguments, 1 for a wgrumus error, 130 for Ctrl-C, each
with one line."""
from __future__ import annotations

import os
import sys

from .. import __version__
from ..runtime.errors import WgrumusError
from . import bench, demo, devices, train
from .common import OneLineParser, UsageError, say_error


def build_parser():
    p = OneLineParser(
        prog="wgrumus",
        description="Deep learning on WebGPU across adapters: data, tensor and pipeline "
                    "parallel training from one command.",
        epilog="Try `wgrumus demo` first. Each command has --help.")
    p.add_argument("--version", action="version", version=f"wgrumus {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{devices,train,bench,demo}",
                           parser_class=OneLineParser)
    sub.required = True
    for mod in (devices, train, bench, demo):
        mod.add_parser(sub)
    p.commands = sub.choices  # name -> its parser, for errors that name `wgrumus <command>`
    return p


def parse(parser, argv=None):
    """The arguments; an unknown option is reported by the command it was given to, so the
    message points to that command's --help (`wgrumus train --help`, not `wgrumus --help`)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv=None) -> int:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences a Vulkan loader warning
    parser = build_parser()
    args = parse(parser, argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (a launch runs it once per rank)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        say_error(f"{parser.prog} {args.command}: error: {e}")
        return 2
    except KeyboardInterrupt:
        say_error("interrupted")
        return 130
    except Exception as e:
        if isinstance(e, WgrumusError):
            say_error(f"{parser.prog} {args.command}: {type(e).__name__}: {e}")
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
