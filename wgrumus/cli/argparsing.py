"""An ArgumentParser whose errors are one line (plus exit code 2), printed by rank 0 only."""
from __future__ import annotations

import argparse
import sys

from .common import env_rank


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints the whole usage block first
        if env_rank() == 0:
            print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
