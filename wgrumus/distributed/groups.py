"""3D parallelism: data x tensor x pipeline subgroups of a world group (torsh's layout, a Rust
framework). Ranks follow Megatron, ``rank = pp * (dp_size * tp_size) + dp * tp_size + tp``: TP
exchanges the most data, so its ranks are adjacent (one node, consecutive devices)."""
from __future__ import annotations

from dataclasses import dataclass

from .process_group import ProcessGroup


@dataclass(frozen=True)
class ThreeDParallelismConfig:
    """Sizes of the data-, tensor- and pipeline-parallel dimensions."""
    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def validate(self, world_size: int | None = None) -> ThreeDParallelismConfig:
        """Self, or a ValueError unless all sizes are ints >= 1 with product ``world_size``."""
        for name in ("dp", "tp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if world_size is not None and self.world_size != world_size:
            raise ValueError(f"dp * tp * pp = {self.dp} * {self.tp} * {self.pp} = "
                             f"{self.world_size} does not match the world size {world_size}; "
                             f"choose sizes whose product is {world_size}")
        return self


class RankMapping:
    """Global rank <-> (dp, tp, pp) coordinates, TP fastest varying."""

    def __init__(self, config: ThreeDParallelismConfig, global_rank: int):
        config.validate()
        if not 0 <= global_rank < config.world_size:
            raise ValueError(f"rank {global_rank} outside a world of {config.world_size} "
                             f"(dp * tp * pp); pass a rank in [0, {config.world_size})")
        self.config = config
        self.global_rank = global_rank
        self.dp_rank, self.tp_rank, self.pp_rank = self.to_3d_coords(config, global_rank)

    def __repr__(self):
        return (f"RankMapping(rank {self.global_rank}: dp {self.dp_rank}, tp {self.tp_rank}, "
                f"pp {self.pp_rank})")

    @staticmethod
    def from_3d_coords(config: ThreeDParallelismConfig, dp: int, tp: int, pp: int) -> int:
        if not (0 <= dp < config.dp and 0 <= tp < config.tp and 0 <= pp < config.pp):
            raise ValueError(f"coordinates (dp={dp}, tp={tp}, pp={pp}) outside {config}; each "
                             f"coordinate must be below its dimension's size")
        return pp * (config.dp * config.tp) + dp * config.tp + tp

    @staticmethod
    def to_3d_coords(config: ThreeDParallelismConfig, rank: int) -> tuple[int, int, int]:
        """(dp, tp, pp) of a global rank."""
        pp, rest = divmod(rank, config.dp * config.tp)
        dp, tp = divmod(rest, config.tp)
        return dp, tp, pp

    # Rank lists of every slice: one list per group, members ordered by their coordinate.
    @staticmethod
    def all_dp_groups(c: ThreeDParallelismConfig) -> list[list[int]]:
        return [[RankMapping.from_3d_coords(c, d, t, p) for d in range(c.dp)]
                for p in range(c.pp) for t in range(c.tp)]

    @staticmethod
    def all_tp_groups(c: ThreeDParallelismConfig) -> list[list[int]]:
        return [[RankMapping.from_3d_coords(c, d, t, p) for t in range(c.tp)]
                for p in range(c.pp) for d in range(c.dp)]

    @staticmethod
    def all_pp_groups(c: ThreeDParallelismConfig) -> list[list[int]]:
        return [[RankMapping.from_3d_coords(c, d, t, p) for p in range(c.pp)]
                for d in range(c.dp) for t in range(c.tp)]

    def dp_group_ranks(self) -> list[int]:
        c = self.config
        return [self.from_3d_coords(c, d, self.tp_rank, self.pp_rank) for d in range(c.dp)]

    def tp_group_ranks(self) -> list[int]:
        c = self.config
        return [self.from_3d_coords(c, self.dp_rank, t, self.pp_rank) for t in range(c.tp)]

    def pp_group_ranks(self) -> list[int]:
        c = self.config
        return [self.from_3d_coords(c, self.dp_rank, self.tp_rank, p) for p in range(c.pp)]

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.config.pp - 1


class ProcessGroupManager:
    """This rank's DP, TP and PP subgroups, split off ``group`` (every rank must construct it)."""

    def __init__(self, config: ThreeDParallelismConfig, group: ProcessGroup):
        config.validate(group.world_size)
        self.config = config
        self.world = group
        self.mapping = m = RankMapping(config, group.rank)
        c = config
        # Color = index of the slice in all_*_groups(); key = coordinate inside the slice.
        self.dp_group = group.split(m.pp_rank * c.tp + m.tp_rank, m.dp_rank,
                                    f"dp[tp{m.tp_rank},pp{m.pp_rank}]")
        self.tp_group = group.split(m.pp_rank * c.dp + m.dp_rank, m.tp_rank,
                                    f"tp[dp{m.dp_rank},pp{m.pp_rank}]")
        self.pp_group = group.split(m.dp_rank * c.tp + m.tp_rank, m.pp_rank,
                                    f"pp[dp{m.dp_rank},tp{m.tp_rank}]")

    def __repr__(self):
        return f"ProcessGroupManager({self.config}, {self.mapping})"

    def _stage(self, delta: int) -> int:
        s = self.mapping.pp_rank + delta
        if not 0 <= s < self.config.pp:
            where = "last" if delta > 0 else "first"
            raise ValueError(f"stage {self.mapping.pp_rank} is the {where} pipeline stage; "
                             f"there is no stage {s}")
        return s

    def send_to_next_stage(self, x, tag: int = 0) -> None:
        """Activations forward: to the same (dp, tp) slot of stage pp + 1."""
        self.pp_group.send(x, self._stage(+1), tag)

    def recv_from_prev_stage(self, tag: int = 0, device=None):
        return self.pp_group.recv(self._stage(-1), tag, device)

    def send_to_prev_stage(self, x, tag: int = 0) -> None:
        """Gradients backward: to the same (dp, tp) slot of stage pp - 1."""
        self.pp_group.send(x, self._stage(-1), tag)

    def recv_from_next_stage(self, tag: int = 0, device=None):
        return self.pp_group.recv(self._stage(+1), tag, device)

    def all_reduce_dp(self, x, op: str = "mean", strategy=None):
        """Average (by default) gradients across data-parallel replicas."""
        return self.dp_group.all_reduce(x, op, strategy)

    def all_reduce_tp(self, x, op: str = "sum", strategy=None):
        """Sum (by default) partial results across tensor-parallel ranks (row-parallel output)."""
        return self.tp_group.all_reduce(x, op, strategy)

    def all_gather_tp(self, x, axis: int = 0, strategy=None):
        """Concatenate tensor-parallel shards along ``axis`` in TP-rank order."""
        return self.tp_group.all_gather(x, axis, strategy)

    def reduce_scatter_tp(self, x, op: str = "sum", axis: int = 0, strategy=None):
        """Sum across TP ranks and keep this rank's shard along ``axis``."""
        return self.tp_group.reduce_scatter(x, op, axis, strategy)

    def stats(self) -> dict:
        return {"world": self.world.stats(), "dp": self.dp_group.stats(),
                "tp": self.tp_group.stats(), "pp": self.pp_group.stats()}
